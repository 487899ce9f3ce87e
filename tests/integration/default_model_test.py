"""The bundled model's numbers, through the real binary: held-out perplexity under f32 within 1% of
the PyTorch figure in its eval.json (and w8a8 within 1% of f32), and greedy continuations equal
to PyTorch's (reference_greedy.json)."""
import argparse
import json
import os
import subprocess
import sys

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "tiny-dsv3")


def moe(binary, args):
    result = subprocess.run([binary] + args, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with open(os.path.join(MODEL, "eval.json")) as f:
        expected = json.load(f)
    with open(os.path.join(MODEL, "reference_greedy.json")) as f:
        greedy = json.load(f)
    failed = 0

    # The model card's scheme: windows of 255 tokens, BOS prepended to each.
    heldout = os.path.join(MODEL, "heldout.txt")
    ppl = {}
    for dtype in ("f32", "w8a8"):
        ppl[dtype] = moe(args.binary, ["perplexity", "--model", MODEL, "--file", heldout, "--window", "255",
                                        "--dtype", dtype, "--json"])["perplexity"]
    for name, value, want, tolerance in [("f32 vs PyTorch", ppl["f32"], expected["perplexity"], 0.01),
                                         ("w8a8 vs f32", ppl["w8a8"], ppl["f32"], 0.01)]:
        ratio = value / want - 1
        ok = abs(ratio) <= tolerance
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} perplexity {name}: {value:.4f} vs {want:.4f} ({ratio:+.3%}, "
              f"allowed {tolerance:.0%})")

    for case in greedy:
        ids = ",".join(str(i) for i in case["prompt_ids"])
        out = moe(args.binary, ["generate", "--model", MODEL, "--prompt-ids", ids, "--dtype", "f32", "--temperature",
                                "0", "--max-tokens", str(len(case["token_ids"])), "--json"])
        ok = out["token_ids"] == case["token_ids"]
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} greedy {case['prompt']!r}: {out['text']!r}")
        if not ok:
            print(f"  want {case['token_ids']}\n  got  {out['token_ids']}")
    total = 2 + len(greedy)
    print(f"default model: {total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
