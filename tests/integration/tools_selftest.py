#!/usr/bin/python3
"""Checks of the Python tools themselves (no moe-serve binary needed): number formats,
safetensors round trips, the checkpoint layout, fp8 block quantization, and that the test
configs exercise what they claim (routing groups matter, logits are not degenerate).

    tools_selftest.py
"""

import json
import math
import os
import struct
import sys
import tempfile
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import checkpoint_io as io  # noqa: E402
import make_tiny_checkpoint as mk  # noqa: E402
import reference_forward as rf  # noqa: E402

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def bf16_rounding():
    one = 0x3F80
    cases = {
        1.0: one,
        1.0 + 2.0 ** -8: one,                 # half-way, 1.0 is even: stays
        1.0 + 3 * 2.0 ** -8: one + 2,         # half-way, rounds up to the even neighbour
        1.0 + 2.0 ** -8 + 2.0 ** -20: one + 1,  # just above half-way
        -2.5: 0xC020,
        float("inf"): 0x7F80,
        3.4e38: 0x7F80,                      # rounds past the largest bf16 to infinity
    }
    for x, want in cases.items():
        got = int(io.f32_to_bf16_bits(np.array([x], dtype=np.float32))[0])
        assert got == want, (x, hex(got), hex(want))
    assert np.isnan(io.bf16_bits_to_f32(io.f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    back = io.bf16_bits_to_f32(io.f32_to_bf16_bits(x))
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8)
    # bf16 values are fixed points of the round trip.
    assert np.array_equal(io.f32_to_bf16_bits(back), io.f32_to_bf16_bits(x))


@test
def e4m3_encoding():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    vals = io.e4m3_bits_to_f32(codes)
    back = io.f32_to_e4m3_bits(vals)
    # Every finite code decodes and re-encodes to itself (except -0 -> +0).
    same = (back == codes) | ((codes == 0x80) & (back == 0))
    assert same.all(), codes[~same]
    assert io.e4m3_bits_to_f32(np.array([0x7E]))[0] == 448.0
    assert io.e4m3_bits_to_f32(np.array([0x01]))[0] == 2.0 ** -9
    enc = lambda x: int(io.f32_to_e4m3_bits(np.array([x]))[0])  # noqa: E731
    assert enc(1000.0) == 0x7E and enc(-1e9) == 0xFE and enc(460.0) == 0x7E  # saturate
    assert enc(float("nan")) == 0x7F
    assert enc(1.0 + 1 / 16) == enc(1.0)          # half-way to 1.125: to the even code (1.0)
    assert enc(1.125 + 1 / 16) == enc(1.25)       # half-way 1.125..1.25: even code is 1.25
    assert enc(1.0 + 1 / 16 + 1e-6) == enc(1.125)
    assert enc(2.0 ** -10) == 0 and enc(2.0 ** -10 * 1.01) == 1  # smallest subnormal / 2
    x = np.random.default_rng(1).uniform(-448, 448, 10000)
    err = np.abs(io.e4m3_bits_to_f32(io.f32_to_e4m3_bits(x)) - x)
    assert np.all(err <= np.maximum(np.abs(x) * 2.0 ** -4, 2.0 ** -10) + 1e-12)


@test
def safetensors_round_trip():
    rng = np.random.default_rng(2)
    f = rng.standard_normal((3, 5)).astype(np.float32)
    tensors = {
        "a.f32": ("F32", f),
        "b.bf16": ("BF16", io.encode(f, "BF16")),
        "c.f16": ("F16", io.encode(f, "F16")),
        "d.fp8": ("F8_E4M3", io.encode(f, "F8_E4M3")),
        "e.vec": ("F32", np.arange(7, dtype=np.float32)),
        "f.scalarish": ("BF16", io.encode(np.ones((1,)), "BF16")),
    }
    with tempfile.TemporaryDirectory() as d:
        for shards in (1, 4):
            sub = os.path.join(d, f"s{shards}")
            io.write_checkpoint(sub, tensors, shards)
            back = io.read_checkpoint(sub)
            assert list(sorted(back)) == sorted(tensors)
            for name, (dt, arr) in tensors.items():
                assert back[name][0] == dt and back[name][1].dtype == arr.dtype, name
                assert np.array_equal(back[name][1], arr), name
        # The raw layout: header length, JSON, 8-byte aligned data start, contiguous offsets.
        with open(os.path.join(d, "s1", io.SINGLE_NAME), "rb") as fh:
            raw = fh.read()
        (n,) = struct.unpack("<Q", raw[:8])
        assert (8 + n) % 8 == 0
        header = json.loads(raw[8:8 + n])
        spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        index = json.load(open(os.path.join(d, "s4", io.INDEX_NAME)))
        assert set(index["weight_map"]) == set(tensors)
        assert set(index["weight_map"].values()) == {io.shard_file_name(i, 4) for i in range(4)}


def expected_shapes(cfg):
    """Every tensor name -> shape, from the brief's list (independent of the writer's code)."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nope, rope, vd = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                          cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    kvl, E, mi = cfg["kv_lora_rank"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
           "lm_head.weight": (V, H)}
    n_mtp = cfg.get("num_nextn_predict_layers") or 0
    for i in range(L + n_mtp):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        if cfg["q_lora_rank"]:
            out[p + "self_attn.q_a_proj.weight"] = (cfg["q_lora_rank"], H)
            out[p + "self_attn.q_a_layernorm.weight"] = (cfg["q_lora_rank"],)
            out[p + "self_attn.q_b_proj.weight"] = (nh * (nope + rope), cfg["q_lora_rank"])
        else:
            out[p + "self_attn.q_proj.weight"] = (nh * (nope + rope), H)
        out[p + "self_attn.kv_a_proj_with_mqa.weight"] = (kvl + rope, H)
        out[p + "self_attn.kv_a_layernorm.weight"] = (kvl,)
        out[p + "self_attn.kv_b_proj.weight"] = (nh * (nope + vd), kvl)
        out[p + "self_attn.o_proj.weight"] = (H, nh * vd)
        if i >= cfg["first_k_dense_replace"]:
            out[p + "mlp.gate.weight"] = (E, H)
            if cfg["topk_method"] == "noaux_tc":
                out[p + "mlp.gate.e_score_correction_bias"] = (E,)
            for j in range(E):
                for n, s in (("gate_proj", (mi, H)), ("up_proj", (mi, H)), ("down_proj", (H, mi))):
                    out[f"{p}mlp.experts.{j}.{n}.weight"] = s
            ns = cfg["n_shared_experts"]
            if ns:
                out[p + "mlp.shared_experts.gate_proj.weight"] = (ns * mi, H)
                out[p + "mlp.shared_experts.up_proj.weight"] = (ns * mi, H)
                out[p + "mlp.shared_experts.down_proj.weight"] = (H, ns * mi)
        else:
            I = cfg["intermediate_size"]  # noqa: E741
            out[p + "mlp.gate_proj.weight"] = (I, H)
            out[p + "mlp.up_proj.weight"] = (I, H)
            out[p + "mlp.down_proj.weight"] = (H, I)
        if i >= L:
            out[p + "embed_tokens.weight"] = (V, H)
            out[p + "enorm.weight"] = (H,)
            out[p + "hnorm.weight"] = (H,)
            out[p + "eh_proj.weight"] = (H, 2 * H)
            out[p + "shared_head.norm.weight"] = (H,)
            out[p + "shared_head.head.weight"] = (V, H)
    return out


def load_case(name):
    with open(os.path.join(HERE, "configs", name + ".json")) as f:
        return json.load(f)


def make_case(name, d):
    c = load_case(name)
    cfg = mk.make_checkpoint(d, c["config"], c["storage"], c["shards"], c["negative_bias"],
                             c["seed"], fixed_routing=c.get("fixed_routing", False))
    return c, cfg


@test
def checkpoint_layout_all_configs():
    for name in sorted(os.listdir(os.path.join(HERE, "configs"))):
        name = name[:-5]
        with tempfile.TemporaryDirectory() as d:
            case, cfg = make_case(name, d)
            raw = io.read_checkpoint(d)
            want = expected_shapes(cfg)
            names = {k for k in raw if not k.endswith("_scale_inv")}
            assert names == set(want), (name, sorted(names ^ set(want))[:6])
            for k, shape in want.items():
                dt, arr = raw[k]
                assert arr.shape == shape, (name, k, arr.shape, shape)
                if k.endswith("e_score_correction_bias"):
                    assert dt == "F32"
                elif case["storage"] == "fp8":
                    is_linear = (len(shape) == 2 and ".layers." in k and "mlp.gate." not in k
                                 and not k.endswith(("embed_tokens.weight", "eh_proj.weight",
                                                     "shared_head.head.weight")))
                    assert dt == ("F8_E4M3" if is_linear else "BF16"), (k, dt)
                    if is_linear:
                        sdt, s = raw[k + "_scale_inv"]
                        assert sdt == "F32" and s.shape == tuple(-(-n // 128) for n in shape)
                else:
                    assert dt == {"f32": "F32", "bf16": "BF16", "f16": "F16"}[case["storage"]]
            for f in ("config.json", "tokenizer.json", "tokenizer_config.json",
                      "generation_config.json"):
                json.load(open(os.path.join(d, f), encoding="utf-8"))
            if case["shards"] > 1:
                assert os.path.exists(os.path.join(d, io.INDEX_NAME))


@test
def deterministic_from_seed():
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        make_case("v3_fp8", a)
        make_case("v3_fp8", b)
        for f in sorted(os.listdir(a)):
            assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read(), f


@test
def streamed_checkpoint_matches_in_memory():
    # Every test config, streamed one tensor at a time with tiny encoding pieces (so tensors
    # are split into row blocks), gives the same files as the in-memory writer.
    saved = mk.STREAM_CHUNK
    mk.STREAM_CHUNK = 1000
    try:
        for name in sorted(os.listdir(os.path.join(HERE, "configs"))):
            c = load_case(name[:-5])
            for shards in sorted({c["shards"], 3}):
                with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                    for d, stream in ((a, False), (b, True)):
                        mk.make_checkpoint(d, c["config"], c["storage"], shards, c["negative_bias"],
                                           c["seed"], fixed_routing=c.get("fixed_routing", False),
                                           stream=stream)
                    assert sorted(os.listdir(a)) == sorted(os.listdir(b)), name
                    for f in sorted(os.listdir(a)):
                        assert (open(os.path.join(a, f), "rb").read()
                                == open(os.path.join(b, f), "rb").read()), (name, shards, f)
    finally:
        mk.STREAM_CHUNK = saved


@test
def fp8_dequant_matches_weights():
    case = load_case("v3_fp8")
    cfg = mk.build_config(case["config"], storage="fp8")
    tensors, kinds, _ = mk.make_weights(cfg, case["seed"], case["negative_bias"])
    with tempfile.TemporaryDirectory() as d:
        make_case("v3_fp8", d)
        deq = io.load_float_weights(d)
    checked = 0
    for name, w in tensors.items():
        if kinds[name] != "linear":
            continue
        w = w.astype(np.float64)
        got = deq[name]
        # Per 128x128 block: error within e4m3's half-ulp (2^-4 relative) or the block's
        # subnormal step.
        for a in range(0, w.shape[0], 128):
            for b in range(0, w.shape[1], 128):
                blk, g = w[a:a + 128, b:b + 128], got[a:a + 128, b:b + 128]
                step = np.abs(blk).max() / 448 * 2.0 ** -9
                assert np.all(np.abs(g - blk) <= np.abs(blk) * 2.0 ** -4 + step), name
                checked += 1
        rel = np.linalg.norm(got - w) / np.linalg.norm(w)
        assert rel < 0.05, (name, rel)
    assert checked > 50


@test
def tokenizer_json_shape():
    t = mk.tokenizer_json()
    vocab = t["model"]["vocab"]
    assert t["model"]["type"] == "BPE" and len(vocab) == 256 + len(mk.MERGES)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert t["decoder"]["type"] == "ByteLevel"
    ids = [a["id"] for a in t["added_tokens"]]
    assert ids == list(range(len(vocab), len(vocab) + 4))
    assert t["pre_tokenizer"]["pretokenizers"][-1]["type"] == "ByteLevel"
    for m in t["model"]["merges"]:
        a, b = m.split(" ")
        assert vocab[a + b] > max(vocab[a], vocab[b])


def routing_choices(model, prompts, variant):
    """Chosen expert sets of every MoE layer/token under the reference's routing and a variant
    ("nogroup": top-k over all experts, "zero": dropped groups masked to 0 instead of -inf)."""
    c = model.cfg
    E, G = c["n_routed_experts"], c["n_group"]
    per, k, kg = E // G, c["num_experts_per_tok"], c["topk_group"]
    diffs = [0, 0]
    original = model.route

    def route(p, x):
        weights, chosen = original(p, x)
        s = torch.sigmoid(model.lin(x, p + "mlp.gate.weight"))
        b_all = s + model.w[p + "mlp.gate.e_score_correction_bias"]
        for t in range(x.shape[0]):
            b = b_all[t].clone()
            if variant == "zero":
                gs = b.view(G, per).sort(-1, descending=True).values[:, :2].sum(-1)
                keep = rf.top_indices(gs.numpy(), kg)
                for g in range(G):
                    if g not in keep:
                        b[g * per:(g + 1) * per] = 0.0
            alt = set(rf.top_indices(b.numpy(), k))
            diffs[0] += alt != set(torch.nonzero(chosen[t]).flatten().tolist())
            diffs[1] += 1
        return weights, chosen

    model.route = route
    try:
        for pr in prompts:
            model.hidden(pr)
    finally:
        model.route = original
    return diffs


@test
def negative_bias_makes_groups_matter():
    with tempfile.TemporaryDirectory() as d:
        case, _ = make_case("v3_negative_bias", d)
        model = rf.Model(d)
        for variant in ("nogroup", "zero"):
            differ, total = routing_choices(model, case["prompts"], variant)
            # Most tokens would route differently without -inf group masking.
            assert differ > total // 2, (variant, differ, total)


@test
def reference_outputs_are_well_formed():
    with tempfile.TemporaryDirectory() as d:
        case, cfg = make_case("v3_plain", d)
        model = rf.Model(d)
        prompt = case["prompts"][1]
        out = rf.run(model, prompt, 4, 5, 3)
        assert out["prompt_ids"] == prompt and len(out["token_ids"]) == 4
        assert len(out["logprobs"]) == 4 and all(len(r) == 5 for r in out["logprobs"])
        assert len(out["mtp_logprobs"]) == len(prompt) + 4 - 1
        for row in out["logprobs"] + out["mtp_logprobs"]:
            lps = [e["logprob"] for e in row]
            assert lps == sorted(lps, reverse=True) and lps[0] <= 0
        assert [r[0]["id"] for r in out["logprobs"]] == out["token_ids"]
        # Full recompute is causal: the last step's hidden states for the prompt equal a
        # prompt-only run's.
        h_all = model.hidden(prompt + out["token_ids"])
        assert torch.allclose(h_all[:len(prompt)], model.hidden(prompt), atol=1e-12)
        # Logits are spread out: typical margins far above float32 noise.
        gen, lps, _ = model.generate(prompt, 8)
        top2 = torch.topk(lps, 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        assert float(np.median(margins)) > 0.05, margins
        assert float(lps.exp().max(-1).values.min()) < 0.99  # not saturated either


@test
def yarn_rope_values():
    with tempfile.TemporaryDirectory() as d:
        make_case("v3_plain", d)
        m = rf.Model(d)
        # rope_dim 8, theta 1e4, orig 4096: low = floor(1.31) = 1, high = ceil(2.82) = 3,
        # so ramp = [0, 0, 0.5, 1]: dims 0-1 keep their frequency, dim 3 is divided by 40.
        base = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)
        ramp = np.array([0.0, 0.0, 0.5, 1.0])
        want = base / 40 * ramp + base * (1 - ramp)
        assert np.allclose(m.inv_freq.numpy(), want, rtol=1e-15)
        g = 0.1 * math.log(40) + 1
        assert math.isclose(m.softmax_scale, 24 ** -0.5 * g * g, rel_tol=1e-15)
        assert m.rope_mul == 1.0


@test
def configs_have_safe_margins():
    """The f32 comparison demands identical tokens: each config's seed was chosen so that the
    reference's greedy choices and expert choices are far from ties compared with float32
    rounding. A change to the generator that moves the weights must keep this true."""
    for fname in sorted(os.listdir(os.path.join(HERE, "configs"))):
        name = fname[:-5]
        with tempfile.TemporaryDirectory() as d:
            case, cfg = make_case(name, d)
            model = rf.Model(d)
            for prompt in case["prompts"]:
                gen, lps, _ = model.generate(prompt, case["max_tokens"])
                top2 = torch.topk(lps, 2, dim=-1).values
                lm = float((top2[:, 0] - top2[:, 1]).min())
                route = float(model.routing_margins(prompt + gen).min())
                mtp_route = (float(model.routing_margins(prompt + gen, mtp=True).min())
                             if cfg.get("num_nextn_predict_layers") else math.inf)
                assert lm > 1e-3 and route > 1e-4 and mtp_route > 1e-4, (name, prompt, lm,
                                                                          route, mtp_route)
                assert len(gen) >= 3, (name, prompt, gen)


def main():
    torch.set_num_threads(1)
    failed = 0
    for fn in TESTS:
        try:
            fn()
            print(f"ok   {fn.__name__}")
        except Exception:  # report every failure, not just the first
            failed += 1
            print(f"FAIL {fn.__name__}")
            traceback.print_exc()
    print(f"tools_selftest: {len(TESTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
