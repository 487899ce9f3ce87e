#!/usr/bin/python3
"""Float64 reference forward pass of a DeepSeek-V3/V2 checkpoint, greedy generation.

    reference_forward.py --model DIR --prompt-ids 1,2,3 --max-tokens N --logprobs K
                         [--mtp-logprobs K] [--ignore-eos]

Prints one JSON object:
    {"prompt_ids": [...], "token_ids": [...],
     "logprobs": [[{"id": i, "logprob": x}, ...], ...],      # top K per generated position
     "mtp_logprobs": [[{"id": i, "logprob": x}, ...], ...]}  # only with --mtp-logprobs

Written from the architecture description, independently of the C++ engine, for clarity over
speed: every step recomputes the whole sequence (no KV cache, no absorbed attention).
Generation stops after max_tokens or right after the EOS token (which is included).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402

DT = torch.float64


def yarn_mscale(scale, mscale):
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


class Model:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = {k: torch.from_numpy(np.ascontiguousarray(v)).to(DT)
                  for k, v in checkpoint_io.load_float_weights(model_dir).items()}
        self.eos_id = self._eos_id(model_dir)
        c = self.cfg
        self.L = c["num_hidden_layers"]
        self.n_mtp = c.get("num_nextn_predict_layers") or 0
        self.eps = c["rms_norm_eps"]
        self.nh = c["num_attention_heads"]
        self.nope, self.rope, self.vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self._setup_rope()
        # When a list, route() appends (layer prefix, position, margin) for every token: the
        # smallest gap that decided its experts (last kept vs first dropped group score, k-th vs
        # (k+1)-th expert). Tiny gaps are where another implementation may route differently.
        self.route_log = None

    def _eos_id(self, model_dir):
        path = os.path.join(model_dir, "generation_config.json")
        eos = self.cfg.get("eos_token_id")
        if os.path.exists(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id", eos)
        if isinstance(eos, list):
            return set(eos)
        return {eos} if eos is not None else set()

    # -- rope ------------------------------------------------------------------------------
    def _setup_rope(self):
        c = self.cfg
        d = self.rope
        theta = float(c.get("rope_theta", 10000.0))
        inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=DT) / d)
        self.softmax_scale = (self.nope + self.rope) ** -0.5
        self.rope_mul = 1.0  # multiplies cos and sin
        rs = c.get("rope_scaling")
        if rs and rs.get("type", rs.get("rope_type")) == "yarn":
            factor = float(rs["factor"])
            orig = float(rs["original_max_position_embeddings"])
            beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))
            mscale, mscale_all = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))

            def corr_dim(r):  # the dimension whose wavelength makes r turns over orig positions
                return d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(theta))

            low = max(math.floor(corr_dim(beta_fast)), 0)
            high = min(math.ceil(corr_dim(beta_slow)), d - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(d // 2, dtype=DT) - low) / (high - low)).clamp(0, 1)
            inv_freq = (inv_freq / factor) * ramp + inv_freq * (1 - ramp)
            self.rope_mul = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
            if factor > 1:
                self.softmax_scale *= yarn_mscale(factor, mscale_all) ** 2
        elif rs:
            raise ValueError(f"unsupported rope_scaling {rs}")
        self.inv_freq = inv_freq

    def apply_rope(self, x, pos):
        """x [T, ..., d]: pairs (2i, 2i+1) rotate by angle pos * inv_freq[i]."""
        ang = pos.to(DT)[:, None] * self.inv_freq[None, :]  # [T, d/2]
        cos = torch.cos(ang) * self.rope_mul
        sin = torch.sin(ang) * self.rope_mul
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (self.rope // 2,)
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    # -- blocks ----------------------------------------------------------------------------
    def rms(self, x, name):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def lin(self, x, name):
        return x @ self.w[name].T

    def attention(self, p, x, pos):
        T = x.shape[0]
        nh, nope, rope, vd = self.nh, self.nope, self.rope, self.vd
        if self.cfg.get("q_lora_rank"):
            q = self.lin(self.rms(self.lin(x, p + "self_attn.q_a_proj.weight"),
                                  p + "self_attn.q_a_layernorm.weight"), p + "self_attn.q_b_proj.weight")
        else:
            q = self.lin(x, p + "self_attn.q_proj.weight")
        q = q.view(T, nh, nope + rope)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        kv = self.lin(x, p + "self_attn.kv_a_proj_with_mqa.weight")
        kvl = self.cfg["kv_lora_rank"]
        c_kv, k_pe = kv[:, :kvl], kv[:, kvl:]
        c_kv = self.rms(c_kv, p + "self_attn.kv_a_layernorm.weight")
        kvb = self.lin(c_kv, p + "self_attn.kv_b_proj.weight").view(T, nh, nope + vd)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        q_pe = self.apply_rope(q_pe, pos)
        k_pe = self.apply_rope(k_pe, pos)  # one head shared by all query heads
        scores = torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, k_pe)
        scores = scores * self.softmax_scale
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("hts,shd->thd", probs, v).reshape(T, nh * vd)
        return self.lin(out, p + "self_attn.o_proj.weight")

    def swiglu(self, x, p):
        g = self.lin(x, p + "gate_proj.weight")
        return self.lin(torch.nn.functional.silu(g) * self.lin(x, p + "up_proj.weight"),
                        p + "down_proj.weight")

    def route(self, p, x):
        """-> ([T, E] routing weights, zero for experts not chosen; [T, E] chosen mask)."""
        c = self.cfg
        E, G = c["n_routed_experts"], c["n_group"]
        k, kg = c["num_experts_per_tok"], c["topk_group"]
        logits = self.lin(x, p + "mlp.gate.weight")
        method = c["topk_method"]
        if c["scoring_func"] == "sigmoid":
            s = torch.sigmoid(logits)
        elif c["scoring_func"] == "softmax":
            s = torch.softmax(logits, dim=-1)
        else:
            raise ValueError(f"unknown scoring_func {c['scoring_func']}")
        if method == "noaux_tc":
            choice = s + self.w[p + "mlp.gate.e_score_correction_bias"]
        else:
            choice = s.clone()
        weights = torch.zeros_like(s)
        chosen_mask = torch.zeros_like(s, dtype=torch.bool)
        per = E // G
        for t in range(x.shape[0]):
            b = choice[t].clone()
            gaps = []
            if method in ("noaux_tc", "group_limited_greedy"):
                grouped = b.view(G, per)
                if method == "noaux_tc":
                    gscore = grouped.sort(dim=-1, descending=True).values[:, :2].sum(-1)
                else:
                    gscore = grouped.max(dim=-1).values
                keep = top_indices(gscore.numpy(), kg)
                if kg < G:
                    ordered = gscore.sort(descending=True).values
                    gaps.append(float(ordered[kg - 1] - ordered[kg]))
                for g in range(G):
                    if g not in keep:
                        b[g * per:(g + 1) * per] = float("-inf")
            elif method != "greedy":
                raise ValueError(f"unknown topk_method {method}")
            chosen = top_indices(b.numpy(), k)
            if self.route_log is not None:
                ordered = b.sort(descending=True).values
                if k < E:
                    gaps.append(float(ordered[k - 1] - ordered[k]))
                self.route_log.append((p, t, min(gaps, default=float("inf"))))
            w = s[t, chosen]
            if c.get("norm_topk_prob"):
                w = w / w.sum()
            weights[t, chosen] = w * c["routed_scaling_factor"]
            chosen_mask[t, chosen] = True
        return weights, chosen_mask

    def moe(self, p, x):
        weights, chosen = self.route(p, x)
        out = torch.zeros_like(x)
        for j in range(self.cfg["n_routed_experts"]):
            rows = torch.nonzero(chosen[:, j]).flatten()
            if rows.numel():
                out[rows] += weights[rows, j:j + 1] * self.swiglu(x[rows], f"{p}mlp.experts.{j}.")
        if self.cfg.get("n_shared_experts"):
            out = out + self.swiglu(x, p + "mlp.shared_experts.")
        return out

    def is_moe(self, i):
        c = self.cfg
        return (c.get("n_routed_experts") is not None and i >= c["first_k_dense_replace"]
                and i % c.get("moe_layer_freq", 1) == 0)

    def block(self, i, x, pos):
        p = f"model.layers.{i}."
        h = x + self.attention(p, self.rms(x, p + "input_layernorm.weight"), pos)
        hn = self.rms(h, p + "post_attention_layernorm.weight")
        return h + (self.moe(p, hn) if self.is_moe(i) else self.swiglu(hn, p + "mlp."))

    # -- model -----------------------------------------------------------------------------
    def hidden(self, tokens):
        """Final hidden states after model.norm, [T, H]."""
        x = self.w["model.embed_tokens.weight"][torch.tensor(tokens)]
        pos = torch.arange(len(tokens))
        for i in range(self.L):
            x = self.block(i, x, pos)
        return self.rms(x, "model.norm.weight")

    def routing_margins(self, tokens, mtp=False):
        """Per position, the smallest routing gap over the main model's MoE layers
        (mtp=True: over the MTP block, positions 0..len-2)."""
        self.route_log = []
        try:
            h = self.hidden(tokens)
            if mtp:
                self.route_log = []
                self.mtp_logprobs(tokens, h)
            out = np.full(len(tokens) - mtp, np.inf)
            for _, t, gap in self.route_log:
                out[t] = min(out[t], gap)
        finally:
            self.route_log = None
        return out

    def logprobs(self, h):
        return torch.log_softmax(h @ self.w["lm_head.weight"].T, dim=-1)

    def mtp_logprobs(self, tokens, h):
        """Row i: the MTP layer's log-probs from h_i and token t_{i+1}, i = 0..len-2."""
        L = self.L
        p = f"model.layers.{L}."
        n = len(tokens) - 1
        e = self.rms(self.w[p + "embed_tokens.weight"][torch.tensor(tokens[1:])], p + "enorm.weight")
        hh = self.rms(h[:n], p + "hnorm.weight")
        x = self.lin(torch.cat([e, hh], dim=-1), p + "eh_proj.weight")
        x = self.block(L, x, torch.arange(n))
        x = self.rms(x, p + "shared_head.norm.weight")
        return torch.log_softmax(x @ self.w[p + "shared_head.head.weight"].T, dim=-1)

    def generate(self, prompt, max_tokens, ignore_eos=False, want_mtp=False):
        """-> (generated ids, [G, V] log-probs of each generated position,
               [P+G-1, V] MTP log-probs or None)."""
        V = self.cfg["vocab_size"]
        for t in prompt:
            if not 0 <= t < V:
                raise ValueError(f"token id {t} outside vocab of {V}")
        tokens = list(prompt)
        gen, rows = [], []
        for _ in range(max_tokens):
            lp = self.logprobs(self.hidden(tokens)[-1])
            nxt = top_indices(lp.numpy(), 1)[0]  # argmax, ties to the lower id
            gen.append(nxt)
            rows.append(lp)
            tokens.append(nxt)
            if nxt in self.eos_id and not ignore_eos:
                break
        mtp = None
        if want_mtp and self.n_mtp and len(tokens) > 1:
            mtp = self.mtp_logprobs(tokens, self.hidden(tokens))
        lps = torch.stack(rows) if rows else torch.zeros(0, V, dtype=DT)
        return gen, lps, mtp


def top_indices(values, k):
    """Indices of the k largest values, largest first; ties go to the lower index."""
    v = np.asarray(values, dtype=np.float64)
    order = np.lexsort((np.arange(len(v)), -v))  # last key is the primary one
    return [int(j) for j in order[:k]]


def top_k_entries(row, k):
    """row: 1-D tensor of log-probs -> [{"id", "logprob"}] of the k best."""
    vals = row.numpy()
    return [{"id": j, "logprob": float(vals[j])} for j in top_indices(vals, k)]


def run(model, prompt, max_tokens, k, mtp_k=None, ignore_eos=False):
    gen, lps, mtp = model.generate(prompt, max_tokens, ignore_eos, want_mtp=mtp_k is not None)
    out = {"prompt_ids": list(prompt), "token_ids": gen,
           "logprobs": [top_k_entries(r, k) for r in lps] if k else []}
    if mtp_k is not None and mtp is not None:
        out["mtp_logprobs"] = [top_k_entries(r, mtp_k) for r in mtp]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--logprobs", type=int, default=5)
    ap.add_argument("--mtp-logprobs", type=int)
    ap.add_argument("--ignore-eos", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    if not prompt:
        sys.exit("reference_forward: empty --prompt-ids")
    model = Model(args.model)
    print(json.dumps(run(model, prompt, args.max_tokens, args.logprobs, args.mtp_logprobs,
                         args.ignore_eos)))


if __name__ == "__main__":
    main()
