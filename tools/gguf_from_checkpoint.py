#!/usr/bin/python3
"""Write a DeepSeek-V3 checkpoint as a GGUF file (Q8_0) that llama.cpp runs, to measure llama.cpp
on our bench model (bench/llama_cpp.sh).

Only what llama.cpp's `deepseek2` architecture reads: the main layers (the MTP layer is left
out, as llama.cpp's own converter does), MLA in its absorbed form (kv_b split into k_b, stored
transposed, and v_b), experts stacked per layer. 2-D weights become Q8_0 (blocks of 32 values,
one FP16 scale each, the format of llama.cpp's `--outtype q8_0`); norms, the router and its
correction bias stay F32.

GGUF (version 3), as documented in ggml's docs/gguf.md: "GGUF", version, tensor count, metadata
count; the metadata (key, type, value); per tensor its name, dimensions (innermost first), type
and data offset; the data, each tensor aligned to 32 bytes. A row-major [rows, cols] array is
the GGUF tensor {cols, rows}.

    tools/gguf_from_checkpoint.py MODEL_DIR OUT.gguf
"""

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402

ALIGNMENT = 32
GGML_F32, GGML_Q8_0 = 0, 8
FILE_TYPE_MOSTLY_Q8_0 = 7
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5
GATING_SOFTMAX, GATING_SIGMOID = 1, 2

# GGUF metadata value types.
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_value(kind, value):
    if kind == STRING:
        return pack_string(value)
    if kind == ARRAY:
        elem_kind, items = value
        return struct.pack("<IQ", elem_kind, len(items)) + b"".join(pack_value(elem_kind, v) for v in items)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[kind], value)


def q8_0(values):
    """float32 values, a multiple of 32 -> Q8_0 blocks: FP16 d = max|x| / 127, then round(x / d)."""
    blocks = values.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / 127
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    out = np.empty(len(blocks), dtype=[("d", "<f2"), ("qs", "i1", 32)])
    out["d"] = d.astype(np.float16)
    out["qs"] = np.rint(blocks * inv[:, None]).astype(np.int8)
    return out.tobytes()


def metadata(config, name, tokenizer, tokenizer_config):
    c = config
    arch = "deepseek2"
    rope = c.get("rope_scaling") or {}
    m = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, name),
        ("general.file_type", U32, FILE_TYPE_MOSTLY_Q8_0),
        ("general.alignment", U32, ALIGNMENT),
        (f"{arch}.block_count", U32, c["num_hidden_layers"]),
        (f"{arch}.context_length", U32, c["max_position_embeddings"]),
        (f"{arch}.embedding_length", U32, c["hidden_size"]),
        (f"{arch}.feed_forward_length", U32, c["intermediate_size"]),
        (f"{arch}.vocab_size", U32, c["vocab_size"]),
        # MLA runs as one shared latent "head" of kv_lora + rope, expanded per head by k_b / v_b.
        (f"{arch}.attention.head_count", U32, c["num_attention_heads"]),
        (f"{arch}.attention.head_count_kv", U32, 1),
        (f"{arch}.attention.key_length", U32, c["kv_lora_rank"] + c["qk_rope_head_dim"]),
        (f"{arch}.attention.value_length", U32, c["kv_lora_rank"]),
        (f"{arch}.attention.key_length_mla", U32, c["qk_nope_head_dim"] + c["qk_rope_head_dim"]),
        (f"{arch}.attention.value_length_mla", U32, c["v_head_dim"]),
        (f"{arch}.attention.q_lora_rank", U32, c["q_lora_rank"]),
        (f"{arch}.attention.kv_lora_rank", U32, c["kv_lora_rank"]),
        (f"{arch}.attention.layer_norm_rms_epsilon", F32, c.get("rms_norm_eps", 1e-6)),
        (f"{arch}.leading_dense_block_count", U32, c["first_k_dense_replace"]),
        (f"{arch}.expert_count", U32, c["n_routed_experts"]),
        (f"{arch}.expert_used_count", U32, c["num_experts_per_tok"]),
        (f"{arch}.expert_shared_count", U32, c["n_shared_experts"]),
        (f"{arch}.expert_group_count", U32, c["n_group"]),
        (f"{arch}.expert_group_used_count", U32, c["topk_group"]),
        (f"{arch}.expert_feed_forward_length", U32, c["moe_intermediate_size"]),
        (f"{arch}.expert_weights_scale", F32, c["routed_scaling_factor"]),
        (f"{arch}.expert_weights_norm", BOOL, bool(c["norm_topk_prob"])),
        (f"{arch}.expert_gating_func", U32,
         GATING_SIGMOID if c.get("scoring_func", "softmax") == "sigmoid" else GATING_SOFTMAX),
        (f"{arch}.rope.dimension_count", U32, c["qk_rope_head_dim"]),
        (f"{arch}.rope.freq_base", F32, c["rope_theta"]),
    ]
    if rope.get("type") == "yarn":
        m += [
            (f"{arch}.rope.scaling.type", STRING, "yarn"),
            (f"{arch}.rope.scaling.factor", F32, rope["factor"]),
            (f"{arch}.rope.scaling.original_context_length", U32, rope["original_max_position_embeddings"]),
            (f"{arch}.rope.scaling.yarn_beta_fast", F32, rope.get("beta_fast", 32)),
            (f"{arch}.rope.scaling.yarn_beta_slow", F32, rope.get("beta_slow", 1)),
            # llama.cpp reads this key as 0.1 x mscale_all_dim (it divides by 0.1 on load).
            (f"{arch}.rope.scaling.yarn_log_multiplier", F32, 0.1 * rope.get("mscale_all_dim", 0)),
        ]
    m += vocabulary(c["vocab_size"], tokenizer, tokenizer_config)
    return m


def vocabulary(vocab_size, tokenizer, tokenizer_config):
    """The byte-level BPE of tokenizer.json, padded with unused tokens to the model's vocab."""
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer.json: model type {model.get('type')!r}, only BPE is written")
    tokens = [None] * vocab_size
    types = [TOKEN_UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        tokens[i], types[i] = text, TOKEN_NORMAL
    for added in tokenizer.get("added_tokens", []):
        i = added["id"]
        if not 0 <= i < vocab_size:
            raise ValueError(f"tokenizer.json: added token {added['content']!r} has id {i}, outside the "
                             f"model's vocabulary of {vocab_size}")
        tokens[i], types[i] = added["content"], TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    by_text = {t: i for i, t in enumerate(tokens)}

    def special_id(key):
        tok = tokenizer_config.get(key)
        text = tok.get("content") if isinstance(tok, dict) else tok
        if text not in by_text:
            raise ValueError(f"tokenizer_config.json: {key} {text!r} is not in the vocabulary")
        return by_text[text]

    return [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "deepseek-v3"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, special_id("bos_token")),
        ("tokenizer.ggml.eos_token_id", U32, special_id("eos_token")),
        ("tokenizer.ggml.add_bos_token", BOOL, bool(tokenizer_config.get("add_bos_token", True))),
    ]


def tensors(config, weights):
    """Yields (GGUF name, float32 array in row-major order, quantize?) in file order."""
    c = config

    def w(name):
        if name not in weights:
            raise ValueError(f"the checkpoint has no tensor {name}")
        dtype, storage = weights[name]
        if name + "_scale_inv" in weights:  # FP8 with block scales, as DeepSeek-V3 ships
            return checkpoint_io.block_dequant(checkpoint_io.decode(dtype, storage),
                                               checkpoint_io.decode(*weights[name + "_scale_inv"])).astype(np.float32)
        return checkpoint_io.decode(dtype, storage).astype(np.float32, copy=False)

    yield "token_embd.weight", w("model.embed_tokens.weight"), True
    for i in range(c["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        yield b + "attn_norm.weight", w(p + "input_layernorm.weight"), False
        yield b + "attn_q_a.weight", w(a + "q_a_proj.weight"), True
        yield b + "attn_q_a_norm.weight", w(a + "q_a_layernorm.weight"), False
        yield b + "attn_q_b.weight", w(a + "q_b_proj.weight"), True
        yield b + "attn_kv_a_mqa.weight", w(a + "kv_a_proj_with_mqa.weight"), True
        yield b + "attn_kv_a_norm.weight", w(a + "kv_a_layernorm.weight"), False
        nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
        kv_b = w(a + "kv_b_proj.weight").reshape(c["num_attention_heads"], nope + v, c["kv_lora_rank"])
        yield b + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)), True
        yield b + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :]), True
        yield b + "attn_output.weight", w(a + "o_proj.weight"), True
        yield b + "ffn_norm.weight", w(p + "post_attention_layernorm.weight"), False
        m = p + "mlp."
        if i < c["first_k_dense_replace"]:
            for part in ("gate", "up", "down"):
                yield b + f"ffn_{part}.weight", w(m + f"{part}_proj.weight"), True
            continue
        yield b + "ffn_gate_inp.weight", w(m + "gate.weight"), False
        yield b + "exp_probs_b.bias", w(m + "gate.e_score_correction_bias"), False
        for part in ("gate", "up", "down"):
            yield b + f"ffn_{part}_exps.weight", np.stack(
                [w(m + f"experts.{e}.{part}_proj.weight") for e in range(c["n_routed_experts"])]), True
        for part in ("gate", "up", "down"):
            yield b + f"ffn_{part}_shexp.weight", w(m + f"shared_experts.{part}_proj.weight"), True
    yield "output_norm.weight", w("model.norm.weight"), False
    yield "output.weight", w("lm_head.weight"), True


def tensor_bytes(array, quantize):
    if quantize:
        if array.shape[-1] % 32:
            raise ValueError(f"a row of {array.shape[-1]} values is not whole Q8_0 blocks of 32")
        return q8_0(array), GGML_Q8_0
    return array.astype("<f4").tobytes(), GGML_F32


def pad(n):
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


def write_gguf(model_dir, out_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    weights = checkpoint_io.map_checkpoint(model_dir)

    # Tensor infos hold each tensor's offset, so the data is converted first into a side file.
    infos, offset = [], 0
    data_path = out_path + ".data"
    with open(data_path, "wb") as data:
        for n, (name, array, quantize) in enumerate(tensors(config, weights)):
            raw, ggml_type = tensor_bytes(array, quantize)
            infos.append((name, array.shape[::-1], ggml_type, offset))
            data.write(raw + b"\0" * pad(len(raw)))
            offset += len(raw) + pad(len(raw))
            print(f"\r[{n + 1}] {name} {list(array.shape)} -> {offset / 1e9:.2f} GB", end="", flush=True)
    print()

    meta = metadata(config, os.path.basename(os.path.normpath(model_dir)), tokenizer, tokenizer_config)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta))
    head += b"".join(pack_string(k) + struct.pack("<I", kind) + pack_value(kind, v) for k, kind, v in meta)
    for name, dims, ggml_type, off in infos:
        head += pack_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", ggml_type, off)
    head += b"\0" * pad(len(head))
    with open(out_path, "wb") as out, open(data_path, "rb") as data:
        out.write(head)
        while chunk := data.read(1 << 26):
            out.write(chunk)
    os.remove(data_path)
    print(f"{out_path}: {len(infos)} tensors, {os.path.getsize(out_path) / 1e9:.2f} GB")


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    try:
        write_gguf(argv[1], argv[2])
    except (OSError, KeyError, ValueError) as e:
        sys.exit(f"gguf_from_checkpoint: {e}")


if __name__ == "__main__":
    main(sys.argv)
