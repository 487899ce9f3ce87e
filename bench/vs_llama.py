#!/usr/bin/env python3
"""moe-serve against llama.cpp on the bench model, in alternating rounds, so that the machine's slow
and fast stretches fall on both alike: the kernels issue's three ratios, measured pairwise, and
batch-1 decode against the bandwidth measured around it.

    python3 bench/vs_llama.py [--rounds 4] [--build build-bench] [--out FILE]

A round runs moe-serve (one `bench-offline` process, w8a8: a warmup, then batch-1 decode, a
512-token prefill and 32 sequences, once each) and llama.cpp (`llama-bench` pp512 and tg64 once,
`llama-batched-bench` at 32 sequences), back to back, moe-serve first in odd rounds and second in
even ones. The figures are the ones bench/e2e.py and bench/llama_cpp.sh report:

    batch-1 decode   decode tok/s of 1 request (128-token prompt, 64 generated)   / tg64
    32 sequences     decode tok/s of 32 requests at once (the same each)          / S_TG at 32
    prefill 512      512 / time to the first token                                / pp512

The memory bandwidth of this kind of VM moves by up to 2x within minutes, so moe-serve's runs are
bracketed by the microbenchmark's read bandwidth: measured once the model has loaded (the runs
held back by --pause-file meanwhile) and again after them. Batch-1 decode's fraction of the
roofline takes the higher of the two, as bench/e2e.py takes the higher of its limits.

Printed: each round's figures and ratios, then the median of each ratio against its goal (the
kernels issue's 2x, 5x, 4x and 80% of the roofline; the engine issue's 8x batch-1 at 32
sequences). llama.cpp comes from bench/llama_cpp.sh --prepare, which builds it the first time
(10-20 min on 2 cores).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from e2e import BENCH_OFFLINE_ENGINE, LoadSampler, model_figures, roofline

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS = "2"
# name: (our run, llama.cpp's figure, the multiple the kernels issue asks for)
FIGURES = {
    "decode_c1": ({"num_requests": 1, "input_len": 128, "output_len": 64, "concurrency": 1}, "tg64", 2.0),
    "decode_c32": ({"num_requests": 32, "input_len": 128, "output_len": 64, "concurrency": 32}, "S_TG@32", 5.0),
    "prefill_512": ({"num_requests": 1, "input_len": 512, "output_len": 1, "concurrency": 1}, "pp512", 4.0),
}


def log(msg):
    print(f"[vs_llama {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def checked(cmd, what, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"vs_llama.py: {what} failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout


class Ours:
    """moe-serve's figures, and the read bandwidth just before and after its runs."""

    def __init__(self, build, model, workdir, env, sampler):
        self.build, self.model, self.workdir, self.env, self.sampler = build, model, workdir, env, sampler
        self.runs_file = os.path.join(workdir, "runs.json")
        runs = [{"name": "warmup", "num_requests": 1, "input_len": 32, "output_len": 4, "concurrency": 1}]
        runs += [dict(spec, name=name) for name, (spec, _, _) in FIGURES.items()]
        with open(self.runs_file, "w") as f:
            json.dump(runs, f)

    def read_gbps(self):
        return roofline(self.build, self.env, self.sampler)["read_GBps"]

    def __call__(self):
        pause, log_path = os.path.join(self.workdir, "pause"), os.path.join(self.workdir, "bench-offline.log")
        open(pause, "w").close()
        cmd = [os.path.join(self.build, "moe-serve"), "bench-offline", "--model", self.model, "--dtype", "w8a8",
               "--runs", self.runs_file, "--json", *BENCH_OFFLINE_ENGINE, "--pause-file", pause]
        with open(log_path, "w") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env)
            while p.poll() is None:
                with open(log_path) as f:
                    if "model loaded" in f.read():
                        break
                time.sleep(0.5)
            before = self.read_gbps()
            os.remove(pause)
            out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"vs_llama.py: {' '.join(cmd)} failed ({p.returncode}); see {log_path}")
        after = self.read_gbps()
        results = {r.get("name"): r for r in map(json.loads, (l for l in out.splitlines() if l.startswith("{")))}
        missing = [name for name in FIGURES if name not in results]
        if missing:
            sys.exit(f"vs_llama.py: bench-offline printed no result for {', '.join(missing)}")
        return {"decode_c1": results["decode_c1"]["decode_tokens_per_s"],
                "decode_c32": results["decode_c32"]["decode_tokens_per_s"],
                "prefill_512": 512 / (results["prefill_512"]["mean_ttft_ms"] / 1000),
                "read_GBps_before": before, "read_GBps_after": after}


def llama(bin_dir, gguf, env):
    """llama.cpp's figures, from llama-bench and llama-batched-bench."""
    out = checked([os.path.join(bin_dir, "llama-bench"), "-m", gguf, "-t", THREADS, "-p", "512", "-n", "64",
                   "-r", "1", "-o", "json"], "llama-bench", env)
    tests = json.loads(out)
    pp = next((t["avg_ts"] for t in tests if t["n_prompt"] == 512 and t["n_gen"] == 0), None)
    tg = next((t["avg_ts"] for t in tests if t["n_prompt"] == 0 and t["n_gen"] == 64), None)
    out = checked([os.path.join(bin_dir, "llama-batched-bench"), "-m", gguf, "-t", THREADS, "-c", "8192", "-b", "2048",
                   "-ub", "512", "-npp", "128", "-ntg", "64", "-npl", "32"], "llama-batched-bench", env)
    # The table's row: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()
            if re.match(r"^\|\s*128\s*\|\s*64\s*\|\s*32\s*\|", line)]
    if pp is None or tg is None or not rows:
        sys.exit(f"vs_llama.py: could not read llama.cpp's figures from its output:\n{out[-2000:]}")
    return {"decode_c1": tg, "decode_c32": float(rows[0][7]), "prefill_512": pp}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--build", default="build-bench", help="where moe-serve, moe_microbench and models/bench-3b are")
    ap.add_argument("--out", help="write every round's figures here (JSON)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    model = os.path.join(args.build, "models", "bench-3b")
    for f in (os.path.join(args.build, "moe-serve"), os.path.join(args.build, "bench", "moe_microbench")):
        if not os.access(f, os.X_OK):
            sys.exit(f"vs_llama.py: {f} missing: cmake --build {args.build} --target moe-serve moe_microbench")
    if not os.path.isfile(os.path.join(model, "config.json")):
        sys.exit(f"vs_llama.py: no bench model at {model} (bench/e2e.py makes it)")
    with open(os.path.join(model, "config.json")) as f:
        decode_bytes = model_figures(json.load(f), "w8a8")["decode_weight_bytes"]
    log("llama.cpp: bench/llama_cpp.sh --prepare")
    prepared = checked(["bash", os.path.join(HERE, "llama_cpp.sh"), "--prepare", args.build], "llama_cpp.sh --prepare")
    bin_dir, gguf = prepared.strip().splitlines()[-2:]
    env = dict(os.environ, MOE_NUM_THREADS=THREADS, OMP_NUM_THREADS=THREADS)

    sampler = LoadSampler().start()
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        ours = Ours(args.build, model, workdir, env, sampler)
        for r in range(1, args.rounds + 1):
            order = [("moe-serve", ours), ("llama.cpp", lambda: llama(bin_dir, gguf, env))]
            if r % 2 == 0:
                order.reverse()
            figures = {}
            for who, measure in order:
                log(f"round {r}: {who}")
                figures[who] = measure()
            m = figures["moe-serve"]
            m["roofline_fraction"] = m["decode_c1"] * decode_bytes / 1e9 / max(m["read_GBps_before"],
                                                                                m["read_GBps_after"])
            rounds.append(figures)
            print(f"round {r}: " + "; ".join(
                f"{name} {m[name]:.1f} / {figures['llama.cpp'][name]:.1f} tok/s = "
                f"{m[name] / figures['llama.cpp'][name]:.2f}x" for name in FIGURES) +
                f"; read {m['read_GBps_before']:.1f} / {m['read_GBps_after']:.1f} GB/s, batch-1 "
                f"{100 * m['roofline_fraction']:.1f}% of the roofline, 32 / batch-1 "
                f"{m['decode_c32'] / m['decode_c1']:.2f}x", flush=True)
    sampler.stop()

    summary = {}

    def report(key, what, values, goal):
        median = statistics.median(values)
        summary[key] = {"rounds": values, "median": median, "goal": goal}
        print(f"{'MET ' if median >= goal else 'MISS'} {what}: median {median:.2f} "
              f"(rounds {' '.join(f'{x:.2f}' for x in values)}; goal >= {goal:g})")

    for name, (_, theirs, multiple) in FIGURES.items():
        report(name, f"{name} / llama.cpp {theirs}", [f["moe-serve"][name] / f["llama.cpp"][name] for f in rounds],
               multiple)
    report("roofline_fraction", "batch-1 decode, fraction of the roofline",
           [f["moe-serve"]["roofline_fraction"] for f in rounds], 0.8)
    report("c32_over_c1", "decode at 32 sequences / batch-1",
           [f["moe-serve"]["decode_c32"] / f["moe-serve"]["decode_c1"] for f in rounds], 8.0)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rounds": rounds,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
