"""Writes and reads the Hugging Face-format checkpoint of the tiny model."""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkpoint_io  # noqa: E402


def hf_config(arch, vocab_size, bos_id, eos_id):
    """The config.json of a DeepSeek-V3 checkpoint, with this model's sizes (`arch`)."""
    rs = dict(arch["rope_scaling"])
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "ep_size": 1,
        "first_k_dense_replace": arch["first_k_dense_replace"],
        "hidden_act": "silu",
        "hidden_size": arch["hidden_size"],
        "initializer_range": arch["initializer_range"],
        "intermediate_size": arch["intermediate_size"],
        "kv_lora_rank": arch["kv_lora_rank"],
        "max_position_embeddings": int(rs["original_max_position_embeddings"] * rs["factor"]),
        "moe_intermediate_size": arch["moe_intermediate_size"],
        "moe_layer_freq": 1,
        "n_group": arch["n_group"],
        "n_routed_experts": arch["n_routed_experts"],
        "n_shared_experts": arch["n_shared_experts"],
        "norm_topk_prob": True,
        "num_attention_heads": arch["num_attention_heads"],
        "num_experts_per_tok": arch["num_experts_per_tok"],
        "num_hidden_layers": arch["num_hidden_layers"],
        "num_key_value_heads": arch["num_attention_heads"],
        "num_nextn_predict_layers": arch["num_nextn_predict_layers"],
        "pretraining_tp": 1,
        "q_lora_rank": arch["q_lora_rank"],
        "qk_nope_head_dim": arch["qk_nope_head_dim"],
        "qk_rope_head_dim": arch["qk_rope_head_dim"],
        "rms_norm_eps": arch["rms_norm_eps"],
        "rope_scaling": rs,
        "rope_theta": arch["rope_theta"],
        "routed_scaling_factor": arch["routed_scaling_factor"],
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": arch["topk_group"],
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "v_head_dim": arch["v_head_dim"],
        "vocab_size": vocab_size,
    }
    return cfg


def write_checkpoint(model, out_dir, config, bos_id, eos_id):
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for name, t in sorted(model.export_tensors().items()):
        arr = t.numpy().astype(np.float32)
        if name.endswith("e_score_correction_bias"):
            tensors[name] = ("F32", checkpoint_io.encode(arr, "F32"))
        else:
            tensors[name] = ("BF16", checkpoint_io.encode(arr, "BF16"))
    checkpoint_io.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": bos_id, "eos_token_id": eos_id,
                   "do_sample": False, "transformers_version": config["transformers_version"]}, f, indent=2)
        f.write("\n")
    return sum(arr.size for _, arr in tensors.values())


def load_into(model, model_dir):
    """Loads an exported checkpoint into the training model (any dtype); checks that the MTP
    layer's embedding and head copies equal the main ones, as the training model shares them."""
    w = checkpoint_io.load_float_weights(model_dir)
    L = model.L
    p = f"model.layers.{L}."
    for own, main in ((p + "embed_tokens.weight", "model.embed_tokens.weight"),
                      (p + "shared_head.head.weight", "lm_head.weight")):
        if not np.array_equal(w.pop(own), w[main]):
            raise ValueError(f"{own} differs from {main}")
    sd = model.state_dict()
    missing = set(sd) - set(w)
    extra = set(w) - set(sd)
    if missing or extra:
        raise ValueError(f"checkpoint/model mismatch: missing {sorted(missing)[:5]} extra {sorted(extra)[:5]}")
    with torch.no_grad():
        for k, v in sd.items():
            v.copy_(torch.from_numpy(w[k]).to(v.dtype))
