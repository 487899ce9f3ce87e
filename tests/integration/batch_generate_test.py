"""`moe-serve generate --input-file`: the bundled model's five reference prompts run together
through the batching engine must give PyTorch's greedy continuations (reference_greedy.json),
each on its own output line in input order; a malformed line is rejected naming file and line."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "tiny-dsv3")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with open(os.path.join(MODEL, "reference_greedy.json")) as f:
        cases = json.load(f)
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        requests = os.path.join(work, "requests.jsonl")
        with open(requests, "w") as f:
            for case in cases:
                f.write(json.dumps({"prompt_ids": case["prompt_ids"], "max_tokens": len(case["token_ids"])}) + "\n")
        result = subprocess.run([args.binary, "generate", "--model", MODEL, "--input-file", requests, "--dtype", "f32",
                                 "--temperature", "0"], capture_output=True, text=True, timeout=600)
        lines = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]
        if result.returncode != 0 or len(lines) != len(cases):
            print(f"FAIL batch run: exit {result.returncode}, {len(lines)} lines\n{result.stderr[-2000:]}")
            return 1
        for i, (case, line) in enumerate(zip(cases, lines)):
            ok = line["index"] == i and line["token_ids"] == case["token_ids"]
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {case['prompt']!r}: {line['text']!r}")

        bad = os.path.join(work, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "fine"}\n{"prompt": 3}\n')
        result = subprocess.run([args.binary, "generate", "--model", MODEL, "--input-file", bad], capture_output=True,
                                text=True, timeout=600)
        ok = result.returncode == 1 and "bad.jsonl:2" in result.stderr
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} malformed line: {result.stderr.strip()}")
    print(f"batch generate: {len(cases) + 1 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
