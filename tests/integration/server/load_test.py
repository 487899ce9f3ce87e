"""Load: C concurrent streaming clients (threads) for D seconds against the default model. Asserts
zero failed requests, every stream well-formed (valid JSON events, ends with [DONE], the tokens
streamed match usage), and server RSS (the supervisor's children, from /proc) roughly flat after
warm-up. CI runs a small scale; the full scale is

    python3 tests/integration/server/load_test.py --binary build/moe-serve --clients 256 --duration 60

Prints the figures: requests served, failures, RSS at 1/3 of the run and at the end."""
import argparse
import json
import random
import sys
import threading
import time

import serverlib as sl
from serverlib import check

PROMPTS = ["Once upon a time", "The little dog", "Tell me about the sea.", "Why is the sky blue?",
           "Write a poem about a cat.", "In the morning, the village"]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = 0
        self.failures = []
        self.tokens = 0
        self.by_reason = {}

    def success(self, tokens, reasons):
        with self.lock:
            self.ok += 1
            self.tokens += tokens
            for r in reasons:
                self.by_reason[r] = self.by_reason.get(r, 0) + 1

    def fail(self, what):
        with self.lock:
            self.failures.append(what)


def one_request(port, rng, api_key, lengths=(4, 48)):
    """One streamed request checked end to end; returns (tokens, finish reasons) or raises."""
    chat = rng.random() < 0.5
    max_tokens = rng.randint(*lengths)
    n = 2 if rng.random() < 0.1 else 1
    body = {"model": sl.MODEL_NAME, "max_tokens": max_tokens, "stream": True, "n": n,
            "stream_options": {"include_usage": True}, "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": rng.randint(0, 1 << 30)}
    prompt = rng.choice(PROMPTS) + " " * rng.randint(0, 3)
    # Logprobs let the client count the tokens it received.
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        body["logprobs"] = True
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        body["logprobs"] = 0
        path = "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn, resp = sl.open_stream(port, path, body, headers=headers, timeout=300)
    try:
        if resp.status != 200:
            raise sl.TestFailure(f"status {resp.status}: {resp.read()[:300]!r}")
        check(resp.getheader("Content-Type", "").startswith("text/event-stream"), "content-type")
        tokens = [0] * n
        finish = [None] * n
        usage = None
        done = False
        for data in sl.sse_events(resp):
            check(not done, "event after [DONE]")
            if data == "[DONE]":
                done = True
                continue
            obj = json.loads(data)
            check("error" not in obj, f"error event {obj}")
            if obj["choices"] == []:
                usage = obj["usage"]
                continue
            check(len(obj["choices"]) == 1, "one choice per chunk")
            choice = obj["choices"][0]
            i = choice["index"]
            check(finish[i] is None, f"chunk after finish for choice {i}")
            lp = choice.get("logprobs")
            if lp:
                tokens[i] += len(lp["content"]) if chat else len(lp["tokens"])
            if choice["finish_reason"]:
                finish[i] = choice["finish_reason"]
        check(done, "no [DONE]")
        check(all(finish), f"unfinished choices {finish}")
        check(usage is not None, "no usage chunk")
        check(usage["completion_tokens"] == sum(tokens), f"usage {usage} vs streamed tokens {tokens}")
        for i in range(n):
            check(tokens[i] <= max_tokens, f"choice {i}: {tokens[i]} tokens > max_tokens {max_tokens}")
            if finish[i] == "length":
                check(tokens[i] == max_tokens, f"choice {i} 'length' after {tokens[i]} of {max_tokens}")
        return sum(tokens), finish
    finally:
        conn.close()


def client(port, seed, deadline, stats, api_key):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            tokens, reasons = one_request(port, rng, api_key)
            stats.success(tokens, reasons)
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            stats.fail(f"client {seed}: {type(e).__name__}: {e}")


def proc_threads(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def warm_up(server, concurrency):
    """Short streamed requests over fresh connections until every API-server thread has served one: the
    HTTP thread pool hands connections to its threads in turn, and each thread's stack and
    allocator cache become resident on first use, so RSS climbs until all have. Returns how many
    requests that took; any failure fails the test."""
    total = int(1.25 * sum(proc_threads(p) for p in server.api_pids()))
    lock = threading.Lock()
    left = [total]
    failures = []

    def worker(i):
        rng = random.Random(-1 - i)
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            try:
                one_request(server.port, rng, None, lengths=(1, 3))  # the load's own kind, short
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    check(not failures, f"{len(failures)} warm-up requests failed: {failures[:3]}")
    return total


def run(args):
    with sl.Server(args.binary, *args.extra, api_servers=args.api_servers) as server:
        port = server.port
        rss_before = server.rss_kib()
        warm = warm_up(server, args.clients)
        print(f"warm-up: {warm} requests, RSS {rss_before / 1024:.1f} -> {server.rss_kib() / 1024:.1f} MiB")
        stats = Stats()
        samples = []  # (seconds since start, {"api": KiB, "engine": KiB})
        start = time.monotonic()
        deadline = start + args.duration
        stop_sampling = threading.Event()

        def sample():
            while not stop_sampling.is_set():
                rss = {"api": 0, "engine": 0}
                for pid in server.children():
                    role = sl.role_of(pid)
                    if role in rss:
                        rss[role] += sl.proc_rss_kib(pid)
                samples.append((time.monotonic() - start, rss))
                stop_sampling.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=client, args=(port, i, deadline, stats, None), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.duration + 300)
        stop_sampling.set()
        sampler.join()
        hung = sum(t.is_alive() for t in threads)
        elapsed = time.monotonic() - start

        metrics = server.metrics()
        check(server.proc.poll() is None, "the server exited under load")
        # RSS after warm-up (the largest sample around 1/3 of the run) against the end of the load
        # (the largest sample of its last part), per role and in all.
        window = max(1.0, args.duration / 20)
        rss = {}
        for role in ("api", "engine", "all"):
            def of(sample_rss, role=role):
                return sum(sample_rss.values()) if role == "all" else sample_rss[role]
            third = [of(r) for t, r in samples if abs(t - args.duration / 3) <= window]
            end = [of(r) for t, r in samples if args.duration - window <= t <= args.duration]
            rss[role] = (of(samples[0][1]), max(third), max(end), max(of(r) for _, r in samples))
        print(f"clients {args.clients}, duration {args.duration:.0f} s (ran {elapsed:.1f} s), "
              f"API servers {args.api_servers}")
        print(f"requests served {stats.ok}, failed {len(stats.failures)}, hung clients {hung}, "
              f"tokens streamed {stats.tokens} ({stats.tokens / elapsed:.0f} tok/s), finish reasons {stats.by_reason}")
        for role, (first, third, end, peak) in rss.items():
            print(f"RSS {role:6}: start {first / 1024:.1f} MiB, at 1/3 {third / 1024:.1f} MiB, end {end / 1024:.1f} MiB, "
                  f"peak {peak / 1024:.1f} MiB (growth after warm-up {100.0 * (end - third) / third:+.1f}%)")
        print(f"engine: running {metrics.get('moe:num_requests_running')}, "
              f"waiting {metrics.get('moe:num_requests_waiting')}, "
              f"KV usage {metrics.get('moe:kv_cache_usage_perc')}, "
              f"preemptions {metrics.get('moe:num_preemptions_total')}")
        print("RSS over time (s: api MiB / engine MiB): " + ", ".join(
            f"{t:.0f}: {r['api'] / 1024:.0f}/{r['engine'] / 1024:.0f}" for t, r in samples[::max(1, len(samples) // 12)]))
        for f in stats.failures[:10]:
            print("  failure:", f)
        check(hung == 0, f"{hung} clients did not finish")
        check(not stats.failures, f"{len(stats.failures)} failed requests")
        check(stats.ok >= args.clients, f"only {stats.ok} requests served")
        check(metrics.get("moe:num_requests_running") == 0 and metrics.get("moe:num_requests_waiting") == 0,
              "requests left in the engine after the load")
        if sl.is_sanitized(args.binary):
            # ASan holds freed memory in its quarantine (256 MB a process): RSS grows by design.
            print("RSS not checked: the binary is built with AddressSanitizer")
        else:
            for role, (_, third, end, _) in rss.items():
                check(end <= third * (1 + args.max_rss_growth),
                      f"{role} RSS grew {third} -> {end} KiB after warm-up (more than {args.max_rss_growth:.0%})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20, help="seconds of load")
    parser.add_argument("--api-servers", type=int, default=2)
    parser.add_argument("--max-rss-growth", type=float, default=0.20,
                        help="largest allowed RSS growth from 1/3 of the run to its end")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more moe-serve serve arguments")
    args = parser.parse_args()
    sys.exit(sl.run_cases([("load", lambda: run(args))]))


if __name__ == "__main__":
    main()
