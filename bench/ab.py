#!/usr/bin/env python3
"""A/B of moe-serve builds on the bench model, alternating so that the machine's slow and fast
stretches fall on every build alike.

    python3 bench/ab.py [--case c32] [--rounds 3] [--build build-bench] BIN_A BIN_B [BIN ...]

A round runs every binary once, in order, each a `bench-offline` process (w8a8) running a warmup
and then the case's run three times; a run's figure is the median over its three. The figure is
the median decode step (ms) for decode cases and the mean time to first token (ms) for prefill.
Printed: each run's figures, then for each binary after the first its ratio to the first in each
round (the two ran back to back) and the median of those ratios. Below 1 is faster.

On this kind of shared 2-vCPU machine one run's figures move by 5-10% from minute to minute and
by more between stretches (bench/RESULTS.md); a difference smaller than that needs several rounds
that agree, and a microbenchmark to say where it comes from.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from e2e import BENCH_OFFLINE_ENGINE

# name: (run, figure, unit)
CASES = {
    "c1": ({"num_requests": 1, "input_len": 128, "output_len": 64, "concurrency": 1}, "median_decode_step_ms",
           "decode step ms"),
    "c32": ({"num_requests": 32, "input_len": 128, "output_len": 64, "concurrency": 32}, "median_decode_step_ms",
            "decode step ms"),
    "p2048": ({"num_requests": 1, "input_len": 2048, "output_len": 1, "concurrency": 1}, "mean_ttft_ms",
              "TTFT ms"),
}
REPEATS = 3


def run(binary, model, case, runs_file):
    """The case's figure in each of the process's repeats."""
    cmd = [binary, "bench-offline", "--model", model, "--dtype", "w8a8", "--runs", runs_file, "--json",
           *BENCH_OFFLINE_ENGINE]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"ab.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    figure = CASES[case][1]
    figures = [r[figure] for r in map(json.loads, (l for l in p.stdout.splitlines() if l.startswith("{")))
               if r.get("name") == case]
    if not figures:
        sys.exit(f"ab.py: {' '.join(cmd)} printed no result for {case}")
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="+", help="moe-serve executables; the first is the baseline")
    ap.add_argument("--case", choices=sorted(CASES), default="c32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", default="build-bench", help="where bench/e2e.py made models/bench-3b")
    args = ap.parse_args()
    if len(args.binaries) < 2:
        ap.error("give at least two binaries to compare")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    model = os.path.join(args.build, "models", "bench-3b")
    if not os.path.isfile(os.path.join(model, "config.json")):
        sys.exit(f"ab.py: no bench model at {model} (bench/e2e.py makes it)")
    for b in args.binaries:
        if not os.access(b, os.X_OK):
            sys.exit(f"ab.py: {b} is not an executable")

    spec, _, unit = CASES[args.case]
    runs = [{"name": "warmup", "num_requests": 1, "input_len": 32, "output_len": 4, "concurrency": 1},
            dict(spec, name=args.case, repeat=REPEATS)]
    medians = {b: [] for b in args.binaries}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(runs, f)
        f.flush()
        for r in range(1, args.rounds + 1):
            for b in args.binaries:
                figures = run(b, model, args.case, f.name)
                medians[b].append(statistics.median(figures))
                print(f"round {r} {b}: {unit} {' '.join(f'{x:.1f}' for x in figures)}", flush=True)
    base = medians[args.binaries[0]]
    for b in args.binaries[1:]:
        ratios = [x / y for x, y in zip(medians[b], base)]
        print(f"{b} / {args.binaries[0]}, {args.case} {unit}: rounds {' '.join(f'{x:.3f}' for x in ratios)}, "
              f"median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
