"""`moe-serve bench-serve` against a real `moe-serve serve` on the bundled model: a fixed-
concurrency run, a Poisson-rate run and a short concurrency sweep must complete every request with
exact token counts and write every field of their JSON results; bad flags, an unreachable server
and a workload longer than the model's context fail with one clear `error:` line. The server is
started on a free port and always stopped, with every process it started."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "server"))
import serverlib as sl  # noqa: E402

# Every run's result holds these (the latency ones as mean/median/std/p90/p99).
FIELDS = ["date", "base_url", "model_id", "num_prompts", "input_len", "output_len", "range_ratio", "seed",
          "request_rate", "max_concurrency", "num_cards", "duration", "started_at", "completed", "failed", "first_error",
          "error_counts", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
          "total_token_throughput", "output_throughput_per_card", "total_token_throughput_per_card", "slo",
          "good_requests", "request_goodput", "requests"]
FIELDS += [f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
           for stat in ("mean", "median", "std", "p90", "p99")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, port, log):
        self.port = port
        # Its own process group, so that whatever it started can be found and stopped.
        self.proc = subprocess.Popen([binary, "serve", "--port", str(port), "--kv-cache-memory", "0.05",
                                      "--shutdown-grace", "5"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} while starting")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not healthy after {timeout} s")

    def stop(self):
        """SIGTERM, then SIGKILL to the whole group; returns the processes left over (none expected)."""
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        leftover = sl.group_members(pgid)
        if leftover or self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        # The engine and API servers end with the supervisor (PR_SET_PDEATHSIG): give them a moment.
        deadline = time.time() + 10
        while leftover and time.time() < deadline:
            time.sleep(0.1)
            leftover = sl.group_members(pgid)
        return leftover


class Checks:
    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail and not ok else ""), flush=True)
        return ok


def run(binary, args, timeout=300):
    return subprocess.run([binary, "bench-serve", *args], capture_output=True, text=True, timeout=timeout)


def check_result(c, name, r, num_prompts, input_len, output_len):
    missing = [f for f in FIELDS if f not in r]
    c.check(not missing, f"{name}: every field present", f"missing {missing}")
    c.check(r.get("completed") == num_prompts, f"{name}: completed == {num_prompts}", f"completed {r.get('completed')}")
    c.check(r.get("failed") == 0, f"{name}: no failed request", f"{r.get('failed')} failed: {r.get('first_error')}")
    c.check(r.get("total_output_tokens") == num_prompts * output_len,
            f"{name}: output tokens == {num_prompts} x {output_len}", f"got {r.get('total_output_tokens')}")
    c.check(r.get("total_input_tokens") == num_prompts * input_len,
            f"{name}: input tokens == {num_prompts} x {input_len}", f"got {r.get('total_input_tokens')}")
    rows = r.get("requests", [])
    c.check(len(rows) == num_prompts and all(row.get("output_len") == output_len for row in rows),
            f"{name}: each request has {output_len} output tokens")
    positive = all(r.get(f, 0) > 0 for f in ("duration", "request_throughput", "output_throughput",
                                            "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"))
    c.check(positive, f"{name}: throughput and latencies positive")
    ordered = all(r[f"median_{m}_ms"] <= r[f"p90_{m}_ms"] <= r[f"p99_{m}_ms"] for m in ("ttft", "tpot", "itl", "e2el"))
    c.check(ordered, f"{name}: median <= p90 <= p99")
    c.check(r["mean_e2el_ms"] >= r["mean_ttft_ms"], f"{name}: E2E >= TTFT")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    c = Checks()

    # Before any server exists: bad flags (CLI11, exit 2) and an unreachable server (exit 1).
    dead_port = free_port()
    for flags, what in [(["--num-prompts", "0"], "--num-prompts 0"),
                        (["--range-ratio", "2"], "--range-ratio 2"),
                        (["--preset", "decode-4k4k"], "unknown preset"),
                        (["--preset", "decode-2k2k", "--input-len", "5"], "--preset with --input-len"),
                        (["--sweep-concurrency", "1,2", "--max-concurrency", "4"], "--sweep with --max-concurrency"),
                        (["--tpot-limit-ms", "50"], "--tpot-limit-ms without a sweep"),
                        (["--request-rate", "-1"], "negative --request-rate")]:
        p = run(args.binary, ["--base-url", f"http://127.0.0.1:{dead_port}", *flags])
        lines = p.stderr.strip().splitlines()
        c.check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"),
                f"bad flags, {what}: exit 2, one error line", f"exit {p.returncode}, stderr {p.stderr!r}")
    p = run(args.binary, ["--base-url", f"http://127.0.0.1:{dead_port}", "--num-prompts", "2"], timeout=60)
    c.check(p.returncode == 1 and p.stderr.startswith("error: cannot reach the server at") and
            len(p.stderr.strip().splitlines()) == 1, "unreachable server: exit 1, one clear error line",
            f"exit {p.returncode}, stderr {p.stderr!r}")
    p = run(args.binary, ["--base-url", "ftp://127.0.0.1:1"], timeout=60)
    c.check(p.returncode == 2 and p.stderr.startswith("error: --base-url") and "http://" in p.stderr,
            "a base URL that is not HTTP: exit 2, clear error", p.stderr)

    with tempfile.TemporaryDirectory() as work:
        log_path = os.path.join(work, "server.log")
        with open(log_path, "w") as log:
            server = Server(args.binary, free_port(), log)
            try:
                server.wait_healthy()
                base = ["--base-url", f"http://127.0.0.1:{server.port}", "--no-progress"]

                out = os.path.join(work, "fixed.json")
                p = run(args.binary, [*base, "--num-prompts", "16", "--input-len", "32", "--output-len", "8",
                                      "--max-concurrency", "4", "--seed", "1", "--num-cards", "2",
                                      "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--result-json", out])
                c.check(p.returncode == 0, "fixed concurrency run exits 0", p.stderr[-2000:])
                if os.path.exists(out):
                    with open(out) as f:
                        r = json.load(f)
                    check_result(c, "fixed", r, 16, 32, 8)
                    c.check(r["max_concurrency"] == 4 and r["request_rate"] == "inf", "fixed: settings recorded")
                    c.check(abs(r["output_throughput_per_card"] * 2 - r["output_throughput"]) < 1e-6,
                            "fixed: per-card throughput is output throughput / --num-cards")
                    c.check(r["good_requests"] == 16, "fixed: every request meets generous SLOs",
                            f"good {r['good_requests']}")
                c.check("Serving Benchmark Result" in p.stdout and "Mean TPOT (ms):" in p.stdout,
                        "fixed: report printed", p.stdout[-1000:])

                out = os.path.join(work, "poisson.json")
                p = run(args.binary, [*base, "--num-prompts", "12", "--input-len", "24", "--output-len", "6",
                                      "--request-rate", "20", "--seed", "2", "--slo-tpot-ms", "0.000001",
                                      "--result-json", out])
                c.check(p.returncode == 0, "Poisson rate run exits 0", p.stderr[-2000:])
                if os.path.exists(out):
                    with open(out) as f:
                        r = json.load(f)
                    check_result(c, "poisson", r, 12, 24, 6)
                    c.check(r["max_concurrency"] is None and r["request_rate"] == "20", "poisson: settings recorded")
                    c.check(r["good_requests"] == 0 and r["request_goodput"] == 0,
                            "poisson: nothing meets an impossible TPOT SLO")

                out = os.path.join(work, "sweep.json")
                p = run(args.binary, [*base, "--sweep-concurrency", "1,4", "--num-prompts", "8", "--input-len", "16",
                                      "--output-len", "4", "--tpot-limit-ms", "10000", "--result-json", out])
                c.check(p.returncode == 0, "sweep exits 0", p.stderr[-2000:])
                if os.path.exists(out):
                    with open(out) as f:
                        r = json.load(f)
                    runs = r.get("runs", [])
                    c.check(len(runs) == 2 and [x["max_concurrency"] for x in runs] == [1, 4], "sweep: one run each")
                    for x in runs:
                        check_result(c, f"sweep c={x['max_concurrency']}", x, 8, 16, 4)
                    best = max(runs, key=lambda x: x["output_throughput"]) if runs else None
                    c.check(r.get("tpot_statistic") == "mean" and r.get("best") is not None and
                            r["best"]["max_concurrency"] == best["max_concurrency"],
                            "sweep: names the best run under a generous limit", json.dumps(r.get("best")))
                c.check("best within the limit: concurrency" in p.stdout, "sweep: best printed", p.stdout[-800:])

                p = run(args.binary, [*base, "--input-len", "1000", "--output-len", "100", "--num-prompts", "2"])
                c.check(p.returncode == 1 and "max_model_len 1024" in p.stderr, "too long for the model: clear error",
                        p.stderr)
                p = run(args.binary, [*base, "--model", "no-such-model", "--num-prompts", "2"])
                c.check(p.returncode == 1 and "no-such-model" in p.stderr, "unknown --model: clear error", p.stderr)
                p = run(args.binary, [*base, "--vocab-size", "100000", "--num-prompts", "2", "--input-len", "64",
                                      "--output-len", "2"])
                c.check(p.returncode == 1 and "test request" in p.stderr and "vocabulary" in p.stderr,
                        "out-of-vocabulary ids: the server's error, once", p.stderr)
            except Exception as e:  # noqa: BLE001 - reported as a failure, the server still stopped
                c.check(False, "test ran", repr(e))
            finally:
                leftover = server.stop()
                c.check(not leftover, "server stopped with every process it started", f"left {leftover}")
        if c.failed:
            with open(log_path) as f:
                print("--- server log (tail) ---\n" + f.read()[-3000:])
    print(f"bench-serve: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
