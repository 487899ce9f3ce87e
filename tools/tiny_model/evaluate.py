"""Evaluation of an exported checkpoint with tools/reference_forward.py (float64, the exported BF16
weights): held-out perplexity, MTP next-next-token accuracy, per-layer expert load, greedy samples.

Perplexity window scheme (what `moe-serve perplexity` reproduces): the file is tokenized as one
string without BOS; the ids are cut into consecutive, non-overlapping chunks of CHUNK = 255 tokens
(the last one shorter); each chunk is run as its own sequence [BOS] + chunk at positions
0..len(chunk); every chunk token is scored once, given BOS and the chunk tokens before it.
perplexity = exp(total NLL / number of file tokens).
"""

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import reference_forward  # noqa: E402

CHUNK = 255


def chunks(ids, size=CHUNK):
    return [ids[a:a + size] for a in range(0, len(ids), size)]


class RecordingModel(reference_forward.Model):
    """The reference model, counting the experts each routed token goes to, per layer."""

    def __init__(self, model_dir):
        super().__init__(model_dir)
        self.loads = {}

    def route(self, p, x):
        weights, chosen = super().route(p, x)
        c = chosen.sum(0).numpy().astype(np.int64)
        self.loads[p] = self.loads.get(p, 0) + c
        return weights, chosen


def evaluate(model_dir, tokenizer, text, log=print):
    """-> dict of figures over the held-out text."""
    m = RecordingModel(model_dir)
    bos = tokenizer.bos_id
    ids = tokenizer.encode(text)
    nll = 0.0
    n_tok = 0
    mtp_hit_text = mtp_n_text = 0
    mtp_hit_main = mtp_n_main = 0
    main_hit = 0
    for ci, c in enumerate(chunks(ids)):
        seq = [bos] + c
        h = m.hidden(seq)
        lp = m.logprobs(h).numpy()                      # row j predicts seq[j+1]
        tgt = np.array(seq[1:])
        nll -= float(lp[np.arange(len(c)), tgt].sum())
        n_tok += len(c)
        main_arg = lp.argmax(-1)                         # ties -> lowest id, as reference_forward
        main_hit += int((main_arg[:len(c)] == tgt).sum())
        if len(seq) >= 2:
            mtp = m.mtp_logprobs(seq, h).numpy()        # row i predicts seq[i+2] from h_i, seq[i+1]
            marg = mtp.argmax(-1)
            k = len(seq) - 2                             # rows with a text target seq[i+2]
            mtp_hit_text += int((marg[:k] == np.array(seq[2:])).sum())
            mtp_n_text += k
            # What greedy speculation accepts: the draft equals the main model's own argmax for the
            # same position (row i+1 of the main log-probs), on teacher-forced text.
            mtp_hit_main += int((marg == main_arg[1:len(seq)]).sum())
            mtp_n_main += len(marg)
        if ci % 20 == 0:
            log(f"  eval chunk {ci}: ppl so far {math.exp(nll / n_tok):.3f}")
    loads = {}
    for p, cnt in sorted(m.loads.items(), key=lambda kv: int(kv[0].split(".")[2])):
        layer = int(p.split(".")[2])
        mean = cnt.mean()
        loads[layer] = {"tokens_per_expert": [int(v) for v in cnt],
                        "max_over_mean": float(cnt.max() / mean), "min_over_mean": float(cnt.min() / mean)}
    return {
        "heldout_tokens": n_tok,
        "heldout_chunks": len(chunks(ids)),
        "nll_per_token": nll / n_tok,
        "perplexity": math.exp(nll / n_tok),
        "main_top1_accuracy": main_hit / n_tok,
        "mtp_top1_accuracy_vs_text": mtp_hit_text / max(mtp_n_text, 1),
        "mtp_top1_agreement_with_main_argmax": mtp_hit_main / max(mtp_n_main, 1),
        "expert_load": loads,
    }


def greedy(model_dir, tokenizer, prompts, max_tokens, log=print):
    """Greedy continuations by reference_forward (float64) -> list of dicts."""
    m = reference_forward.Model(model_dir)
    out = []
    for p in prompts:
        ids = tokenizer.encode(p, add_bos=True)
        r = reference_forward.run(m, ids, max_tokens, 2)
        margins = [e[0]["logprob"] - e[1]["logprob"] for e in r["logprobs"]]
        out.append({"prompt": p, "prompt_ids": ids, "token_ids": r["token_ids"],
                    "text": tokenizer.decode(r["token_ids"]),
                    "min_top1_top2_margin": min(margins),
                    "top1_logprobs": [e[0]["logprob"] for e in r["logprobs"]]})
        log(f"  greedy {p!r} -> {out[-1]['text']!r} (min margin {min(margins):.4f})")
    return out


def crosscheck(model_dir, tokenizer, text, torch_model_cls, cfg, n_tokens=200):
    """Runs the training model in float64 on the exported weights and reference_forward on the same
    tokens: -> max |difference| of main and MTP log-probs (should be rounding noise)."""
    from . import export
    ref = reference_forward.Model(model_dir)
    tm = torch_model_cls(cfg).double()
    export.load_into(tm, model_dir)
    seq = [tokenizer.bos_id] + tokenizer.encode(text)[:n_tokens]
    h = ref.hidden(seq)
    lp_ref = ref.logprobs(h)
    mtp_ref = ref.mtp_logprobs(seq, h)
    with torch.no_grad():
        t = torch.tensor(seq)[None]
        hh, yy = tm(t[:, :-1], t[:, 1:])
        lp = torch.log_softmax(tm.logits(hh[0]), -1)
        mtp = torch.log_softmax(tm.logits(yy[0]), -1)
    return (float((lp - lp_ref[:-1]).abs().max()), float((mtp - mtp_ref).abs().max()))
