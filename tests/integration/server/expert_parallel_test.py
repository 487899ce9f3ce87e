#!/usr/bin/python3
"""Expert parallelism changes where experts run, not what the model computes: under w8a8, greedy
outputs of 16 mixed requests are the same text on 1 rank and on 2 and 4 ranks (routed experts split
over them, requests spread over their data-parallel caches), with either MoE exchange, and with the
shared experts on every rank or on a dedicated one, and with two-batch overlap on or off."""

import concurrent.futures
import re

import serverlib as sl
from serverlib import check

# (name, extra serve arguments)
LAYOUTS = [
    ("1 rank", []),
    ("2 ranks, all-to-all", ["--ranks", 2, "--moe-exchange", "all-to-all"]),
    ("2 ranks, all-gather", ["--ranks", 2, "--moe-exchange", "all-gather"]),
    ("4 ranks, all-to-all", ["--ranks", 4, "--moe-exchange", "all-to-all"]),
    ("2 ranks, shared experts on rank 1", ["--ranks", 2, "--shared-expert-ranks", 1]),
    ("4 ranks, shared experts on rank 3, all-gather",
     ["--ranks", 4, "--shared-expert-ranks", 1, "--moe-exchange", "all-gather"]),
    ("2 ranks, all-to-all, two-batch overlap", ["--ranks", 2, "--two-batch-overlap"]),
    ("4 ranks, shared experts on rank 3, two-batch overlap",
     ["--ranks", 4, "--shared-expert-ranks", 1, "--two-batch-overlap"]),
]


def requests():
    """16 requests of mixed prompt and output lengths, each computed once per layout."""
    words = "the cat sat on a mat while some old dog slept near the warm fire and dreamed".split()
    out = []
    for i in range(16):
        prompt = " ".join(words[(i * 5 + j) % len(words)] for j in range(3 + (i * 7) % 40))
        out.append({"prompt": prompt, "max_tokens": 6 + (i * 5) % 20, "temperature": 0, "ignore_eos": True})
    return out


def outputs_of(binary, extra):
    with sl.Server(binary, "--dtype", "w8a8", *extra) as server:
        with concurrent.futures.ThreadPoolExecutor(len(requests())) as pool:
            responses = list(pool.map(lambda body: sl.post(server.port, "/v1/completions", body), requests()))
        for r in responses:
            check(r.status == 200, f"{r!r}")
        if "--ranks" in extra:
            ranks = extra[extra.index("--ranks") + 1]
            shared_ranks = extra[extra.index("--shared-expert-ranks") + 1] if "--shared-expert-ranks" in extra else 0
            log = server.log_text()
            owned = re.findall(r"engine rank (\d+) of (\d+): routed experts (\d+)-(\d+) of (\d+)( and shared)?", log)
            check(len(owned) == ranks - shared_ranks, f"every routed-expert rank reports its experts:\n{log[-3000:]}")
            covered = sorted(e for *_, lo, hi, _, _ in owned for e in range(int(lo), int(hi) + 1))
            check(covered == list(range(int(owned[0][4]))), f"the ranks split the experts: {owned}")
            check(all(bool(shared) == (shared_ranks == 0) for *_, shared in owned),
                  f"shared experts are on every rank or on none of these: {owned}")
            dedicated = re.findall(r"engine rank (\d+) of \d+: shared experts, no routed experts", log)
            check(sorted(int(r) for r in dedicated) == list(range(ranks - shared_ranks, ranks)),
                  f"the last {shared_ranks} rank(s) run the shared experts: {dedicated}")
        # SIGTERM reaches every rank through mpirun, and all of them leave the loop together.
        server.stop()
        check(server.proc.returncode == 0, f"exit status {server.proc.returncode} after SIGTERM")
        check("did not stop in time" not in server.log_text(), f"a process had to be killed:\n{server.log_text()[-3000:]}")
        return [r.json()["choices"][0]["text"] for r in responses]


def run(binary):
    reference = None
    for name, extra in LAYOUTS:
        texts = outputs_of(binary, extra)
        print(f"  {name}: {sum(len(t) for t in texts)} characters generated", flush=True)
        if reference is None:
            reference = texts
            continue
        for i, (want, got) in enumerate(zip(reference, texts)):
            check(got == want, f"{name}, request {i}: {got!r} differs from 1 rank's {want!r}")


if __name__ == "__main__":
    sl.run_main("expert_parallel", run)
