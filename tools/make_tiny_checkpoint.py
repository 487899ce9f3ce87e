#!/usr/bin/python3
"""Write a small random DeepSeek-V3 (or -V2) checkpoint in Hugging Face layout.

    make_tiny_checkpoint.py --out DIR [--seed S] [--config overrides.json]
        [--storage f32|bf16|f16|fp8] [--shards N] [--negative-bias | --fixed-routing]
        [--variant deepseek_v2] [--stream]

--config takes a JSON object of config.json fields over the tiny defaults (a whole config.json
works too: bench/configs/bench-3b.json is the 3.6B bench model). --stream writes one tensor at a
time, for models larger than memory; the files are the same as without it.

Writes config.json, model.safetensors (or N shards + index), tokenizer.json,
tokenizer_config.json and generation_config.json. Everything is a function of the seed and
the options. Weights are scaled so activations stay O(1) and logits are spread out (top-1 vs
top-2 margins are rarely tiny), which keeps greedy decoding stable between implementations.
"""

import argparse
import copy
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402
from tiny_model import dsv3_spec  # noqa: E402

# A small DeepSeek-V3: same fields as the official config.json, tiny sizes.
V3_DEFAULTS = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "kv_lora_rank": 32,
    "max_position_embeddings": 16384,
    "moe_intermediate_size": 24,
    "moe_layer_freq": 1,
    "n_group": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 320,
}

# DeepSeek-V2 differs in routing (softmax, group-limited greedy, no bias, no normalization)
# and has no MTP layer.
V2_CHANGES = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "scoring_func": "softmax",
    "topk_method": "group_limited_greedy",
    "norm_topk_prob": False,
    "routed_scaling_factor": 16.0,
    "num_nextn_predict_layers": 0,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "transformers_version": "4.39.3",
}

FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

# ---------------------------------------------------------------------------------------------
# Tokenizer: a byte-level BPE in the Hugging Face tokenizers schema of DeepSeek-V3's
# tokenizer.json: 256 byte symbols (id = byte value), a few merges, then the special tokens.

BOS, EOS = dsv3_spec.BOS, dsv3_spec.EOS
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"

# Merges in priority order; each result is a new token. "Ġ" is the byte-level space.
MERGES = [
    ("Ġ", "t"), ("Ġ", "a"), ("i", "n"), ("h", "e"), ("r", "e"), ("o", "n"), ("Ġt", "he"),
    ("e", "r"), ("Ġ", "s"), ("a", "t"), ("Ġ", "w"), ("Ġ", "o"), ("e", "n"), ("i", "s"),
    ("o", "r"), ("in", "g"), ("n", "d"), ("Ġa", "nd"), ("Ġ", "Ġ"), ("e", "d"), ("Ġ", "i"),
    ("Ġi", "s"), ("l", "l"), ("Ġ", "h"), ("Ġh", "e"), ("Ġ", "m"), ("Ġ", "1"), ("o", "u"),
]

CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


def byte_to_unicode():
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the others to 256+n."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    n = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def special_token_ids():
    """Ids of BOS, EOS, User, Assistant: right after the byte symbols and merges."""
    first = 256 + len(MERGES)
    return {"bos": first, "eos": first + 1, "user": first + 2, "assistant": first + 3}


def tokenizer_json():
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in MERGES:
        assert a in vocab and b in vocab, (a, b)
        vocab[a + b] = len(vocab)
    ids = special_token_ids()

    def added(id_, content, special):
        # As in DeepSeek-V3's file: BOS/EOS are special, User/Assistant are not.
        return {"id": id_, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": not special, "special": special}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(ids["bos"], BOS, True), added(ids["eos"], EOS, True),
                         added(ids["user"], USER, False),
                         added(ids["assistant"], ASSISTANT, False)],
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": dsv3_spec.PRE_TOKENIZER,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b in MERGES]},
    }


# ---------------------------------------------------------------------------------------------
# Config


def build_config(overrides=None, variant=None, storage="f32"):
    """Defaults for the variant (from overrides' model_type when not given), then overrides."""
    overrides = dict(overrides or {})
    variant = variant or overrides.get("model_type", "deepseek_v3")
    cfg = copy.deepcopy(V3_DEFAULTS)
    if variant == "deepseek_v2":
        cfg.update(copy.deepcopy(V2_CHANGES))
    elif variant != "deepseek_v3":
        raise ValueError(f"unknown variant {variant}")
    cfg.update(overrides)
    ids = special_token_ids()
    cfg.setdefault("bos_token_id", ids["bos"])
    cfg.setdefault("eos_token_id", ids["eos"])
    if storage == "fp8":
        cfg["quantization_config"] = FP8_QUANT_CONFIG
    if cfg["model_type"] == "deepseek_v2" and not cfg.get("num_nextn_predict_layers"):
        del cfg["num_nextn_predict_layers"]  # V2 configs do not have the field
    validate_config(cfg)
    return cfg


def validate_config(cfg):
    ids = special_token_ids()
    if cfg["vocab_size"] <= ids["assistant"]:
        raise ValueError(f"vocab_size must exceed {ids['assistant']} (tokenizer ids)")
    E, G = cfg["n_routed_experts"], cfg["n_group"]
    if E % G:
        raise ValueError("n_routed_experts must be a multiple of n_group")
    if cfg["topk_group"] * (E // G) < cfg["num_experts_per_tok"]:
        raise ValueError("topk_group groups hold fewer experts than num_experts_per_tok")
    if cfg["topk_method"] == "noaux_tc" and E // G < 2:
        raise ValueError("noaux_tc group scores need at least 2 experts per group")
    if cfg["qk_rope_head_dim"] % 2:
        raise ValueError("qk_rope_head_dim must be even")


def is_moe_layer(cfg, i):
    return (cfg.get("n_routed_experts") is not None and i >= cfg["first_k_dense_replace"]
            and i % cfg.get("moe_layer_freq", 1) == 0)


# ---------------------------------------------------------------------------------------------
# Weights


class Maker:
    """Draws tensors in a fixed order from one generator, so a seed fixes everything.

    Without a sink it keeps every tensor (in `tensors`); with one it hands each tensor to
    sink(name, float32 values, kind) as soon as it is drawn and keeps only the kinds, so a
    model larger than memory can be written one tensor at a time."""

    def __init__(self, seed, sink=None):
        self.rng = np.random.default_rng(seed)
        self.sink = sink
        self.tensors = {}  # name -> float32 values, in creation order (without a sink)
        self.kinds = {}    # name -> "linear" (quantizable decoder linear) or "keep"

    def linear(self, name, rows, cols, gain=1.0, quantizable=True):
        w = self.rng.standard_normal((rows, cols))
        w *= gain / math.sqrt(cols)
        w = w.astype(np.float32)  # drops the float64 draw before the sink runs
        self._add(name, w, "linear" if quantizable else "keep")

    def norm(self, name, n):
        self._add(name, 1.0 + 0.1 * self.rng.standard_normal(n), "keep")

    def embed(self, name, rows, cols):
        self._add(name, self.rng.standard_normal((rows, cols)).astype(np.float32), "keep")

    def _add(self, name, values, kind):
        assert name not in self.kinds, name
        self.kinds[name] = kind
        values = np.asarray(values, dtype=np.float32)
        if self.sink is None:
            self.tensors[name] = values
        else:
            self.sink(name, values, kind)


class ShapeMaker(Maker):
    """Records (name, shape, kind) in creation order without drawing any weights."""

    def __init__(self):
        super().__init__(0)
        self.entries = []

    def linear(self, name, rows, cols, gain=1.0, quantizable=True):
        self._shape(name, (rows, cols), "linear" if quantizable else "keep")

    def norm(self, name, n):
        self._shape(name, (n,), "keep")

    def embed(self, name, rows, cols):
        self._shape(name, (rows, cols), "keep")

    def _shape(self, name, shape, kind):
        assert name not in self.kinds, name
        self.kinds[name] = kind
        self.entries.append((name, shape, kind))


def routing_bias(rng, cfg, negative, fixed=False):
    """e_score_correction_bias for one layer.

    Default: small noise. fixed=True: the same experts win for every token by a wide margin
    (+2 for num_experts_per_tok experts spread over topk_group groups, -2 for the rest), so
    lower-precision runs cannot route differently; the weights still vary with the token. negative=True: per-group patterns that make group selection matter:
      a "strong" group (+1) that always survives, a "decoy" group with one very good expert but
      a poor second (so the group loses although that expert would win without grouping),
      a "weak" group with mostly negative biased scores (it often survives as the second group,
      so masking dropped groups to 0 instead of -inf would pick dropped experts over it),
      and "dead" groups far below everything."""
    E, G = cfg["n_routed_experts"], cfg["n_group"]
    per = E // G
    if fixed:
        # Winners are dealt round-robin over topk_group groups so each kept group holds one:
        # its group score then beats every other group's by at least 2.
        k, kg = cfg["num_experts_per_tok"], cfg["topk_group"]
        if k < kg:
            raise ValueError("fixed routing needs num_experts_per_tok >= topk_group")
        groups = rng.permutation(G)[:kg]
        slots = {g: rng.permutation(per) for g in groups}
        bias = np.full(E, -2.0)
        for j in range(k):
            g = groups[j % kg]
            bias[g * per + slots[g][j // kg]] = 2.0
        return bias
    if not negative:
        return 0.05 * rng.standard_normal(E)
    bias = np.empty(E)
    roles = rng.permutation(G)  # group roles differ from layer to layer
    for g in range(G):
        role = roles[g] % 4 if G >= 4 else roles[g]
        sl = slice(g * per, (g + 1) * per)
        if role == 0:    # strong
            b = np.full(per, -2.0)
            b[:2] = 1.0
        elif role == 1:  # decoy
            b = np.full(per, -1.2)
            b[rng.integers(per)] = 0.8
        elif role == 2:  # weak
            b = np.full(per, -0.7)
        else:            # dead
            b = np.full(per, -4.0)
        bias[sl] = rng.permutation(b) + 0.3 * rng.standard_normal(per)
    return bias


def add_decoder_block(m, cfg, i, bias_mode, layer_bias):
    p = f"model.layers.{i}."
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvl = cfg["kv_lora_rank"]
    m.norm(p + "input_layernorm.weight", H)
    if cfg.get("q_lora_rank"):
        ql = cfg["q_lora_rank"]
        m.linear(p + "self_attn.q_a_proj.weight", ql, H)
        m.norm(p + "self_attn.q_a_layernorm.weight", ql)
        m.linear(p + "self_attn.q_b_proj.weight", nh * (nope + rope), ql)
    else:
        m.linear(p + "self_attn.q_proj.weight", nh * (nope + rope), H)
    m.linear(p + "self_attn.kv_a_proj_with_mqa.weight", kvl + rope, H)
    m.norm(p + "self_attn.kv_a_layernorm.weight", kvl)
    m.linear(p + "self_attn.kv_b_proj.weight", nh * (nope + vd), kvl)
    m.linear(p + "self_attn.o_proj.weight", H, nh * vd)
    m.norm(p + "post_attention_layernorm.weight", H)
    if is_moe_layer(cfg, i):
        E, mi = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        # The router stays BF16 in the official FP8 release: not quantizable.
        m.linear(p + "mlp.gate.weight", E, H, gain=1.5, quantizable=False)
        if cfg["topk_method"] == "noaux_tc":
            layer_bias[p + "mlp.gate.e_score_correction_bias"] = routing_bias(
                m.rng, cfg, bias_mode == "negative", bias_mode == "fixed")
        for j in range(E):
            e = f"{p}mlp.experts.{j}."
            m.linear(e + "gate_proj.weight", mi, H)
            m.linear(e + "up_proj.weight", mi, H)
            m.linear(e + "down_proj.weight", H, mi)
        ns = cfg.get("n_shared_experts") or 0
        if ns:
            m.linear(p + "mlp.shared_experts.gate_proj.weight", ns * mi, H)
            m.linear(p + "mlp.shared_experts.up_proj.weight", ns * mi, H)
            m.linear(p + "mlp.shared_experts.down_proj.weight", H, ns * mi)
    else:
        inter = cfg["intermediate_size"]
        m.linear(p + "mlp.gate_proj.weight", inter, H)
        m.linear(p + "mlp.up_proj.weight", inter, H)
        m.linear(p + "mlp.down_proj.weight", H, inter)


def make_weights(cfg, seed, negative_bias=False, fixed_routing=False):
    """-> (dict name -> float32 values, dict name -> kind, dict name -> F32 bias values)."""
    m = Maker(seed)
    biases = draw_weights(m, cfg, negative_bias, fixed_routing)
    return m.tensors, m.kinds, biases


def draw_weights(m, cfg, negative_bias=False, fixed_routing=False):
    """Draws every tensor through Maker `m`, in file order; -> dict name -> bias values."""
    if fixed_routing and cfg["topk_method"] != "noaux_tc":
        raise ValueError("fixed routing works through e_score_correction_bias (noaux_tc)")
    bias_mode = "fixed" if fixed_routing else "negative" if negative_bias else "small"
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    biases = {}
    m.embed("model.embed_tokens.weight", V, H)
    for i in range(L):
        add_decoder_block(m, cfg, i, bias_mode, biases)
    m.norm("model.norm.weight", H)
    # A larger gain on the head spreads the logits so greedy choices are rarely near-ties.
    m.linear("lm_head.weight", V, H, gain=3.0, quantizable=False)
    for k in range(cfg.get("num_nextn_predict_layers") or 0):
        i = L + k
        p = f"model.layers.{i}."
        m.embed(p + "embed_tokens.weight", V, H)
        m.norm(p + "enorm.weight", H)
        m.norm(p + "hnorm.weight", H)
        m.linear(p + "eh_proj.weight", H, 2 * H, quantizable=False)  # BF16 in the release
        add_decoder_block(m, cfg, i, bias_mode, biases)
        m.norm(p + "shared_head.norm.weight", H)
        m.linear(p + "shared_head.head.weight", V, H, gain=3.0, quantizable=False)
    return biases


def quantize_fp8_blocks(w, block=128):
    """w [R, C] -> (e4m3 codes [R, C], scale_inv [ceil(R/128), ceil(C/128)] float32)
    with scale_inv = amax/448 per block, so w ~= decode(codes) * scale_inv."""
    R, C = w.shape
    br, bc = -(-R // block), -(-C // block)
    scale = np.empty((br, bc), dtype=np.float32)
    codes = np.empty((R, C), dtype=np.uint8)
    for a in range(br):
        for b in range(bc):
            blk = w[a * block:(a + 1) * block, b * block:(b + 1) * block]
            amax = float(np.max(np.abs(blk)))
            s = np.float32(amax / checkpoint_io.E4M3_MAX) if amax > 0 else np.float32(1.0)
            scale[a, b] = s
            codes[a * block:(a + 1) * block, b * block:(b + 1) * block] = \
                checkpoint_io.f32_to_e4m3_bits(blk / np.float64(s))
    return codes, scale


STORAGE_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def encoded_specs(name, shape, kind, storage):
    """The (name, dtype, shape) entries one tensor becomes in the file."""
    if storage in STORAGE_DTYPE:
        return [(name, STORAGE_DTYPE[storage], shape)]
    if storage == "fp8":
        if kind == "linear":
            return [(name, "F8_E4M3", shape),
                    (name + "_scale_inv", "F32", tuple(-(-n // 128) for n in shape))]
        return [(name, "BF16", shape)]
    raise ValueError(f"unknown storage {storage}")


def encode_tensor(name, w, kind, storage):
    """-> list of (name, dtype, storage array) for one float tensor, as encoded_specs says."""
    if storage in STORAGE_DTYPE:
        return [(name, STORAGE_DTYPE[storage], checkpoint_io.encode(w, STORAGE_DTYPE[storage]))]
    if storage == "fp8":
        if kind == "linear":
            codes, scale = quantize_fp8_blocks(w)
            return [(name, "F8_E4M3", codes), (name + "_scale_inv", "F32", scale)]
        return [(name, "BF16", checkpoint_io.encode(w, "BF16"))]
    raise ValueError(f"unknown storage {storage}")


def encode_tensors(tensors, kinds, biases, storage):
    """Float tensors -> ordered dict name -> (dtype, storage) per the storage mode.
    Biases are always F32 as in the official release."""
    out = {}
    for name, w in tensors.items():
        for n, dtype, arr in encode_tensor(name, w, kinds[name], storage):
            out[n] = (dtype, arr)
    for name, b in biases.items():
        out[name] = ("F32", np.asarray(b, dtype=np.float32))
    return out


def checkpoint_specs(cfg, storage, negative_bias=False, fixed_routing=False):
    """(name, dtype, shape) of every tensor in the file, in order, without drawing weights."""
    m = ShapeMaker()
    biases = draw_weights(m, cfg, negative_bias, fixed_routing)
    specs = []
    for name, shape, kind in m.entries:
        specs.extend(encoded_specs(name, shape, kind, storage))
    specs.extend((name, "F32", (cfg["n_routed_experts"],)) for name in biases)
    return specs


# Elements encoded per piece when streaming, to bound the temporaries of the encoders.
STREAM_CHUNK = 1 << 23


def write_weights_streaming(out_dir, cfg, storage, shards, negative_bias, seed, fixed_routing,
                            progress=None):
    """Draws and writes the weights one tensor at a time: memory holds one tensor (as float32)
    plus a piece of its encoding, whatever the model's size. Same bytes as the in-memory path."""
    specs = checkpoint_specs(cfg, storage, negative_bias, fixed_routing)
    total = sum(math.prod(shape) for _, _, shape in specs)
    done = [0, 0.0]  # elements written, fraction last reported

    with checkpoint_io.StreamingCheckpointWriter(out_dir, specs, shards) as writer:
        def sink(name, w, kind):
            if storage in STORAGE_DTYPE and w.ndim == 2 and w.size > STREAM_CHUNK:
                # Elementwise encodings: row blocks give the bytes the whole tensor would.
                dtype = STORAGE_DTYPE[storage]
                rows = max(1, STREAM_CHUNK // w.shape[1])
                writer.begin(name, dtype)
                for r in range(0, w.shape[0], rows):
                    writer.write(checkpoint_io.encode(w[r:r + rows], dtype))
                writer.end()
            else:
                for n, dtype, arr in encode_tensor(name, w, kind, storage):
                    writer.add(n, dtype, arr)
            done[0] += w.size
            if progress and done[0] / total - done[1] >= 0.05:
                done[1] = done[0] / total
                progress(f"{100 * done[1]:.0f}% of {total / 1e9:.2f}G values written")

        m = Maker(seed, sink)
        biases = draw_weights(m, cfg, negative_bias, fixed_routing)
        for name, b in biases.items():
            writer.add(name, "F32", np.asarray(b, dtype=np.float32))


def make_checkpoint(out_dir, overrides=None, storage="f32", shards=1, negative_bias=False,
                    seed=0, variant=None, fixed_routing=False, stream=False, progress=None):
    """Writes the whole checkpoint directory; returns the config dict. stream=True writes one
    tensor at a time (for models larger than memory); the files are the same."""
    cfg = build_config(overrides, variant, storage)
    os.makedirs(out_dir, exist_ok=True)
    if stream:
        write_weights_streaming(out_dir, cfg, storage, shards, negative_bias, seed, fixed_routing,
                                progress)
    else:
        tensors, kinds, biases = make_weights(cfg, seed, negative_bias, fixed_routing)
        encoded = encode_tensors(tensors, kinds, biases, storage)
        checkpoint_io.write_checkpoint(out_dir, encoded, shards)
    ids = special_token_ids()

    def dump(name, obj):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump("config.json", cfg)
    dump("tokenizer.json", tokenizer_json())
    dump("tokenizer_config.json", dsv3_spec.tokenizer_config(CHAT_TEMPLATE, 16384))
    dump("generation_config.json", {"_from_model_config": True, "bos_token_id": ids["bos"],
                                    "eos_token_id": ids["eos"], "do_sample": True,
                                    "temperature": 0.6, "top_p": 0.95,
                                    "transformers_version": cfg["transformers_version"]})
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="JSON file of config.json overrides")
    ap.add_argument("--storage", choices=["f32", "bf16", "f16", "fp8"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--negative-bias", action="store_true",
                    help="routing biases that make group selection (and -inf masking) matter")
    ap.add_argument("--fixed-routing", action="store_true",
                    help="routing biases that pick the same experts for every token by a wide "
                         "margin (for bf16 comparisons, where near-ties would flip)")
    ap.add_argument("--variant", choices=["deepseek_v3", "deepseek_v2"])
    ap.add_argument("--stream", action="store_true",
                    help="draw and write one tensor at a time (same files; for models larger "
                         "than memory, e.g. bench/configs/bench-3b.json)")
    args = ap.parse_args()
    overrides = {}
    if args.config:
        with open(args.config) as f:
            overrides = json.load(f)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.stream else None
    cfg = make_checkpoint(args.out, overrides, args.storage, args.shards, args.negative_bias,
                          args.seed, args.variant, args.fixed_routing, args.stream, progress)
    print(f"wrote {cfg['model_type']} checkpoint to {args.out}")


if __name__ == "__main__":
    main()
