"""Bad input to the moe-serve CLI: each case must exit non-zero (1 for bad files and values, 2 for
a malformed command line) with one 'error:' line naming what and where, never crash or hang. Starts the real binary on a random tiny checkpoint and corrupted
copies of it."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")


def run(binary, args):
    return subprocess.run([binary] + args, capture_output=True, text=True, timeout=120)


def corrupt(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def truncate_weights(d):
    path = os.path.join(d, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def header_length_beyond_file(d):
    path = os.path.join(d, "model.safetensors")
    with open(path, "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))


def edit_config(**changes):
    def edit(d):
        path = os.path.join(d, "config.json")
        with open(path) as f:
            config = json.load(f)
        for key, value in changes.items():
            if value is None:
                del config[key]
            else:
                config[key] = value
        with open(path, "w") as f:
            json.dump(config, f)
    return edit


def drop_tensor(name):
    def edit(d):
        sys.path.insert(0, TOOLS)
        import checkpoint_io  # noqa: E402
        path = os.path.join(d, "model.safetensors")
        tensors, metadata = checkpoint_io.read_safetensors(path)
        del tensors[name]
        checkpoint_io.write_safetensors(path, tensors, metadata)
    return edit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="moe_cli_")
    good = os.path.join(work, "good")
    subprocess.run([sys.executable, os.path.join(TOOLS, "make_tiny_checkpoint.py"), "--out", good, "--seed", "5"],
                   check=True, capture_output=True)

    gen = ["generate", "--temperature", "0"]
    cases = [
        ("missing directory", gen + ["--model", os.path.join(work, "nope"), "--prompt-ids", "1"], ["nope"]),
        ("truncated weights", gen + ["--model", corrupt(good, os.path.join(work, "trunc"), truncate_weights),
                                     "--prompt-ids", "1"], ["model.safetensors"]),
        ("header length beyond the file",
         gen + ["--model", corrupt(good, os.path.join(work, "hdr"), header_length_beyond_file), "--prompt-ids", "1"],
         ["model.safetensors", "header"]),
        ("config missing a field",
         gen + ["--model", corrupt(good, os.path.join(work, "nofield"), edit_config(hidden_size=None)),
                "--prompt-ids", "1"], ["config.json", "hidden_size"]),
        ("top-k above the expert count",
         gen + ["--model", corrupt(good, os.path.join(work, "topk"), edit_config(num_experts_per_tok=99)),
                "--prompt-ids", "1"], ["config.json", "num_experts_per_tok"]),
        ("missing tensor",
         gen + ["--model", corrupt(good, os.path.join(work, "notensor"), drop_tensor("model.norm.weight")),
                "--prompt-ids", "1"], ["model.norm.weight"]),
        ("token id outside the vocabulary", gen + ["--model", good, "--prompt-ids", "1,100000"], ["100000"]),
        ("not a token id", gen + ["--model", good, "--prompt-ids", "1,x"], ["--prompt-ids", "x"]),
        ("prompt longer than the context", gen + ["--model", good, "--prompt-ids", "1", "--max-tokens", "999999"],
         ["context"]),
        ("max-tokens not a number", gen + ["--model", good, "--prompt-ids", "1", "--max-tokens", "many"],
         ["--max-tokens"]),
        ("unknown flag", gen + ["--model", good, "--prompt-ids", "1", "--frobnicate"], ["--frobnicate"]),
        ("unknown dtype", gen + ["--model", good, "--prompt-ids", "1", "--dtype", "fp4"], ["--dtype", "fp4"]),
        ("two prompts", gen + ["--model", good, "--prompt-ids", "1", "--prompt", "hi"], ["--prompt"]),
        ("missing text file", ["perplexity", "--model", good, "--file", os.path.join(work, "none.txt")], ["none.txt"]),
    ]
    failed = 0
    for name, argv, words in cases:
        result = run(args.binary, argv)
        error_lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
        problems = []
        if result.returncode not in (1, 2):
            problems.append(f"exit code {result.returncode}, want 1 or 2")
        if len(error_lines) != 1:
            problems.append(f"{len(error_lines)} 'error:' lines, want 1")
        elif not all(w in error_lines[0] for w in words):
            problems.append(f"error line lacks {words}: {error_lines[0]!r}")
        if problems:
            failed += 1
            print(f"FAIL {name}: {'; '.join(problems)}\n  stderr: {result.stderr.strip()[-500:]}")
        else:
            print(f"ok   {name}: {error_lines[0]}")
    shutil.rmtree(work)
    print(f"cli errors: {len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
