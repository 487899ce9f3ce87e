#!/usr/bin/python3
"""Expert parallelism on one machine: R ranks x 1 thread against 1 rank x R threads.

    bench/expert_parallel.py [--binary build-bench/moe-serve] [--model build-bench/models/bench-3b]
                             [--ranks 2] [--concurrency 16,32] [--output-len 64]

Starts `moe-serve serve` (w8a8) once per layout: one rank with R threads, then R ranks of one
thread each with the all-to-all exchange, with all-gather + reduce-scatter, and with all-to-all
with two-batch overlap. For each
concurrency C it runs `moe-serve bench-serve` (128-token random prompts, 2C requests, streaming)
and reads /metrics before and after: the communication share of a rank is its time in MoE
exchanges (moe:moe_exchange_seconds_total, waiting for the other ranks included) over its time in
steps (moe:engine_step_seconds_total). Prints one row per layout and concurrency."""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "server"))
import serverlib as sl  # noqa: E402


def per_rank(metrics, name):
    """{rank: value} of a counter that every rank reports."""
    out = {}
    for key, value in metrics.items():
        if key.startswith(name + "{") and 'rank="' in key:
            out[int(key.split('rank="')[1].split('"')[0])] = value
        elif key == name:
            out[0] = value
    return out


def bench(args, server, concurrency):
    before = server.metrics()
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([args.binary, "bench-serve", "--base-url", f"http://127.0.0.1:{server.port}",
                        "--input-len", "128", "--output-len", str(args.output_len),
                        "--num-prompts", str(2 * concurrency), "--max-concurrency", str(concurrency),
                        "--seed", "7", "--no-progress", "--result-json", out.name],
                       check=True, stdout=subprocess.DEVNULL)
        result = json.load(open(out.name))
    after = server.metrics()
    shares = []
    steps_after, steps_before = per_rank(after, "moe:engine_step_seconds_total"), per_rank(before, "moe:engine_step_seconds_total")
    exchange_after = per_rank(after, "moe:moe_exchange_seconds_total")
    exchange_before = per_rank(before, "moe:moe_exchange_seconds_total")
    for rank in sorted(steps_after):
        step = steps_after[rank] - steps_before.get(rank, 0)
        exchange = exchange_after.get(rank, 0) - exchange_before.get(rank, 0)
        shares.append(exchange / step if step > 0 else 0.0)
    return result, shares


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build-bench", "moe-serve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "build-bench", "models", "bench-3b"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--concurrency", default="16,32")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--layouts", default="one-rank,all-to-all,all-gather,overlap",
                    help="which layouts, in this order")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the layouts this many times, alternating")
    args = ap.parse_args()
    r = args.ranks
    known = {"one-rank": (f"1 rank x {r} threads", 1, r, []),
             "all-to-all": (f"{r} ranks x 1 thread, all-to-all", r, 1, ["--moe-exchange", "all-to-all"]),
             "all-gather": (f"{r} ranks x 1 thread, all-gather", r, 1, ["--moe-exchange", "all-gather"]),
             "overlap": (f"{r} ranks x 1 thread, all-to-all, two-batch overlap", r, 1,
                         ["--moe-exchange", "all-to-all", "--two-batch-overlap"])}
    layouts = [known[name] for name in args.layouts.split(",")] * args.rounds
    print("| layout | concurrency | output tok/s | mean TPOT ms | failed | MoE exchange share of step time, per rank |")
    print("|---|---|---|---|---|---|")
    for name, ranks, threads, extra in layouts:
        os.environ.update({"MOE_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)})
        with sl.Server(args.binary, "--ranks", ranks, "--kv-cache-memory", "1", *extra, model=args.model,
                       startup_timeout=900) as server:
            for c in [int(x) for x in args.concurrency.split(",")]:
                result, shares = bench(args, server, c)
                share_text = ", ".join(f"{100 * s:.0f}%" for s in shares) if ranks > 1 else "-"
                print(f"| {name} | {c} | {result['output_throughput']:.1f} | {result['mean_tpot_ms']:.0f} | "
                      f"{result['failed']} | {share_text} |", flush=True)


if __name__ == "__main__":
    main()
