"""The DeepSeek-V3 architecture in PyTorch for training, batched and float32.

It computes the same function as tools/reference_forward.py (the float64 inference reference the
C++ engine is checked against): MLA with q/kv LoRA, interleaved-pair RoPE on q_pe and the shared
k_pe head with YaRN inv_freq and mscale, the YaRN-scaled softmax scale, noaux_tc sigmoid routing
with group-limited top-k on biased scores and unbiased, normalized, scaled weights, one shared
expert, and one MTP layer fed [enorm(embed(t_{i+1})); hnorm(h_i)] with h_i after model.norm.
Parameter names are the Hugging Face checkpoint's, so export is a rename-free copy; the MTP layer
shares the main embedding and lm_head during training (as in the DeepSeek-V3 report) and gets its
own copies (model.layers.L.embed_tokens, .shared_head.head) at export.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def yarn_mscale(scale, mscale):
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


def rope_tables(cfg):
    """-> (inv_freq [d/2] float64, rope_mul, softmax_scale), as reference_forward._setup_rope."""
    d = cfg["qk_rope_head_dim"]
    theta = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    softmax_scale = (cfg["qk_nope_head_dim"] + d) ** -0.5
    rope_mul = 1.0
    rs = cfg.get("rope_scaling")
    if rs:
        assert rs["type"] == "yarn"
        factor = float(rs["factor"])
        orig = float(rs["original_max_position_embeddings"])
        beta_fast, beta_slow = float(rs["beta_fast"]), float(rs["beta_slow"])
        mscale, mscale_all = float(rs["mscale"]), float(rs["mscale_all_dim"])

        def corr_dim(r):
            return d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(theta))

        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv_freq = (inv_freq / factor) * ramp + inv_freq * (1 - ramp)
        rope_mul = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        if factor > 1:
            softmax_scale *= yarn_mscale(factor, mscale_all) ** 2
    return inv_freq, rope_mul, softmax_scale


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x = x.to(self.weight.dtype)  # norms run in the parameters' precision, never in bf16
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(i, o):
    return nn.Linear(i, o, bias=False)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh, self.nope, self.rope, self.vd = nh, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kvl = cfg["kv_lora_rank"]
        self.q_a_proj = linear(H, cfg["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(cfg["q_lora_rank"], cfg["rms_norm_eps"])
        self.q_b_proj = linear(cfg["q_lora_rank"], nh * (self.nope + self.rope))
        self.kv_a_proj_with_mqa = linear(H, self.kvl + self.rope)
        self.kv_a_layernorm = RMSNorm(self.kvl, cfg["rms_norm_eps"])
        self.kv_b_proj = linear(self.kvl, nh * (self.nope + self.vd))
        self.o_proj = linear(nh * self.vd, H)

    @staticmethod
    def rotate(x, cos, sin):
        """Interleaved pairs (2i, 2i+1) rotate by the angle of frequency i. cos/sin [T, d/2]."""
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)

    def forward(self, x, cos, sin, scale, mask):
        B, T, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, self.nh, self.nope + self.rope)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        kv = self.kv_a_proj_with_mqa(x)
        c_kv, k_pe = kv[..., :self.kvl], kv[..., self.kvl:]
        kvb = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(B, T, self.nh, self.nope + self.vd)
        k_nope, v = kvb[..., :self.nope], kvb[..., self.nope:]
        q_pe = self.rotate(q_pe, cos[:, None, :], sin[:, None, :])          # [B,T,nh,r]
        k_pe = self.rotate(k_pe, cos, sin)                                  # [B,T,r]
        qh = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)              # [B,nh,T,n+r]
        kh = torch.cat([k_nope, k_pe[:, :, None, :].expand(B, T, self.nh, self.rope)], dim=-1).transpose(1, 2)
        scores = torch.matmul(qh, kh.transpose(-1, -2)).to(cos.dtype) * scale
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(1, 2))  # [B,nh,T,vd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.vd))


class MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = linear(H, inter)
        self.up_proj = linear(H, inter)
        self.down_proj = linear(inter, H)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.E, self.G = cfg["n_routed_experts"], cfg["n_group"]
        self.k, self.kg = cfg["num_experts_per_tok"], cfg["topk_group"]
        self.scale = cfg["routed_scaling_factor"]
        self.norm = cfg["norm_topk_prob"]
        self.weight = nn.Parameter(torch.empty(self.E, cfg["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.E))

    def forward(self, x):
        """x [N, H] -> (expert ids [N, k], weights [N, k]). Runs in the parameters' precision
        (outside bf16 autocast), so routing sees the same scores as inference."""
        with torch.autocast("cpu", enabled=False):
            s = torch.sigmoid(F.linear(x.to(self.weight.dtype), self.weight))
        b = (s + self.e_score_correction_bias).detach()
        N = x.shape[0]
        grouped = b.view(N, self.G, self.E // self.G)
        gscore = grouped.topk(2, dim=-1).values.sum(-1)                   # [N, G]
        gidx = gscore.topk(self.kg, dim=-1).indices
        gmask = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gidx, True)
        emask = gmask[:, :, None].expand(N, self.G, self.E // self.G).reshape(N, self.E)
        idx = b.masked_fill(~emask, float("-inf")).topk(self.k, dim=-1).indices
        w = s.gather(1, idx)
        if self.norm:
            w = w / w.sum(-1, keepdim=True)
        return idx, w * self.scale


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(MLP(H, cfg["moe_intermediate_size"]) for _ in range(cfg["n_routed_experts"]))
        self.shared_experts = MLP(H, cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        self.last_load = None  # tokens routed to each expert in the last forward

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.gate(x)
        out = self.shared_experts(x).to(x.dtype)
        flat = idx.flatten()
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=len(self.experts))
        self.last_load = counts
        rows = order // idx.shape[1]            # token of each sorted assignment
        wsorted = w.flatten()[order]
        start = 0
        for j, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            r = rows[start:start + n]
            y = self.experts[j](x[r]) * wsorted[start:start + n, None]
            out = out.index_add(0, r, y)
            start += n
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, cfg, moe):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MoE(cfg) if moe else MLP(H, cfg["intermediate_size"])

    def forward(self, x, cos, sin, scale, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, scale, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTPLayer(Block):
    """model.layers.L: enorm, hnorm, eh_proj, a decoder block, shared_head.norm (the embedding and
    head are the main model's while training)."""

    def __init__(self, cfg):
        super().__init__(cfg, moe=True)
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = RMSNorm(H, eps)
        self.hnorm = RMSNorm(H, eps)
        self.eh_proj = linear(2 * H, H)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(H, eps)


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        L = cfg["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        layers = [Block(cfg, moe=i >= cfg["first_k_dense_replace"]) for i in range(L)]
        layers += [MTPLayer(cfg) for _ in range(cfg["num_nextn_predict_layers"])]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class DeepseekV3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.L = cfg["num_hidden_layers"]
        self.model = Inner(cfg)
        self.lm_head = linear(cfg["hidden_size"], cfg["vocab_size"])
        inv_freq, self.rope_mul, self.softmax_scale = rope_tables(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._init_weights(cfg)

    def _init_weights(self, cfg):
        std = cfg["initializer_range"]
        n_res = 2 * (cfg["num_hidden_layers"] + 1)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norm weights stay 1
            s = std
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                s = std / math.sqrt(n_res)  # GPT-2 style scaling of residual-branch outputs
            nn.init.normal_(p, 0.0, s)

    def rope(self, T, dtype):
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        return ((torch.cos(ang) * self.rope_mul).to(dtype), (torch.sin(ang) * self.rope_mul).to(dtype))

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, MoE)]

    def forward(self, inp, nxt):
        """inp [B, T] tokens t_0..t_{T-1}; nxt [B, T] the tokens that follow them, t_1..t_T.
        -> (h [B, T, H] after model.norm, y [B, T, H] after the MTP layer's shared_head.norm).
        lm_head(h[:, i]) predicts t_{i+1}; lm_head(y[:, i]) predicts t_{i+2} (from h_i and t_{i+1})."""
        B, T = inp.shape
        dtype = self.lm_head.weight.dtype
        cos, sin = self.rope(T, dtype)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = self.model.embed_tokens(inp)
        for i in range(self.L):
            x = self.model.layers[i](x, cos, sin, self.softmax_scale, mask)
        h = self.model.norm(x)
        mtp = self.model.layers[self.L]
        e = mtp.enorm(self.model.embed_tokens(nxt))
        y = mtp.eh_proj(torch.cat([e, mtp.hnorm(h)], dim=-1))
        y = mtp(y, cos, sin, self.softmax_scale, mask)
        return h, mtp.shared_head.norm(y)

    def logits(self, h):
        return F.linear(h, self.lm_head.weight).to(self.lm_head.weight.dtype)

    def chunked_ce(self, h, targets, chunk=1024):
        """Mean cross-entropy of lm_head(h) against targets, over rows where target >= 0, computed
        in chunks of rows so that no logits tensor reaches 32 MB (glibc would mmap it, and page
        faults are slow on this VM)."""
        h = h.reshape(-1, h.shape[-1])
        targets = targets.reshape(-1)
        total = h.new_zeros((), dtype=torch.float32)
        n = int((targets >= 0).sum())
        for a in range(0, h.shape[0], chunk):
            lg = self.logits(h[a:a + chunk]).float()
            total = total + F.cross_entropy(lg, targets[a:a + chunk], ignore_index=-1, reduction="sum")
        return total / max(n, 1)

    @torch.no_grad()
    def update_bias(self, speed):
        """Auxiliary-loss-free balancing (DeepSeek-V3 report, 2.1.2): after each step, raise the bias
        of under-loaded experts and lower that of over-loaded ones by `speed`."""
        for moe in self.moe_layers():
            load = moe.last_load.float()
            moe.gate.e_score_correction_bias += speed * torch.sign(load.mean() - load)

    def export_tensors(self):
        """-> dict HF name -> float32 tensor, with the MTP layer's own embedding and head copies."""
        sd = {k: v.detach().float().clone() for k, v in self.state_dict().items()}
        p = f"model.layers.{self.L}."
        sd[p + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
        sd[p + "shared_head.head.weight"] = sd["lm_head.weight"].clone()
        return sd
