#!/usr/bin/python3
"""Does one API server keep the engine fed? Requests/s with 1 vs N API servers at max_tokens 1.

    bench/api_scale_out.py [--binary build/moe-serve] [--api-servers 1,2] [--rounds 3]
                           [--num-prompts 3000] [--concurrency 64]

For each round and each API-server count (round-robin, so all see the same machine load): starts
`moe-serve serve` on the default model (w8a8, one thread each), runs `moe-serve bench-serve`
(8 random prompt tokens, 1 generated, streaming), and reads the engine's step counters from
/metrics before and after. "engine busy" is the share of the run's wall time the engine spent
inside Engine::Step; the rest it was draining/sending messages or waiting for work, i.e. on the
front end. Prints one line per run and the best of each count."""

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


def one_run(args, api_servers, seed):
    env_threads = {"MOE_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    os.environ.update(env_threads)
    with sl.Server(args.binary, "--kv-cache-memory", "0.05", api_servers=api_servers) as server:
        before = server.metrics()
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([args.binary, "bench-serve", "--base-url", f"http://127.0.0.1:{server.port}",
                            "--input-len", "8", "--output-len", "1", "--num-prompts", str(args.num_prompts),
                            "--max-concurrency", str(args.concurrency), "--seed", str(seed), "--no-progress",
                            "--result-json", out.name], check=True, stdout=subprocess.DEVNULL)
            result = json.load(open(out.name))
        after = server.metrics()
    busy = (after["moe:engine_step_seconds_total"] - before["moe:engine_step_seconds_total"]) / result["duration"]
    return {"api_servers": api_servers, "req_s": result["request_throughput"], "failed": result["failed"],
            "mean_ttft_ms": result["mean_ttft_ms"], "p99_ttft_ms": result["p99_ttft_ms"], "engine_busy": busy,
            "loadavg1": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "moe-serve"))
    ap.add_argument("--api-servers", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    counts = [int(c) for c in args.api_servers.split(",")]
    runs = []
    for rnd in range(args.rounds):
        for n in counts:
            r = one_run(args, n, 100 + rnd)
            runs.append(r)
            print(f"round {rnd + 1}, {n} API server(s): {r['req_s']:.0f} req/s, {r['failed']} failed, TTFT mean "
                  f"{r['mean_ttft_ms']:.0f} / p99 {r['p99_ttft_ms']:.0f} ms, engine busy {100 * r['engine_busy']:.0f}%, "
                  f"load {r['loadavg1']:.1f}", flush=True)
    for n in counts:
        best = max((r for r in runs if r["api_servers"] == n), key=lambda r: r["req_s"])
        print(f"best, {n} API server(s): {best['req_s']:.0f} req/s (engine busy {100 * best['engine_busy']:.0f}%)")


if __name__ == "__main__":
    main()
