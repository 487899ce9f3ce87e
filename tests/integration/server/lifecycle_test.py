"""Server lifecycle through real processes and signals:
  disconnect      a client that disconnects mid-stream, the engine stalled, has its request aborted
  disconnect_running  the same with the engine running: the request ends, its cache freed
  sigterm_grace   SIGTERM with a request in flight and a long grace: it completes, exit 0, no child left
  sigterm_abort   SIGTERM with --shutdown-grace 0: the stream ends with an error event, exit 0
  api_crash       kill -9 of one API server: the other keeps serving, a replacement appears
  engine_crash    kill -9 of the engine: 503 with a clear message, no hang
  rank_crash      the same for one rank of two (--ranks 2): the whole instance fails fast
  rank_hang       one rank of two stopped (SIGSTOP): past --rank-timeout the instance fails the same way
  startup_errors  a bad --model or a port in use: non-zero exit with one 'error:' line
Every assertion is about behaviour; time limits only bound waits so that nothing hangs."""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import serverlib as sl
from serverlib import check

COMP = "/v1/completions"
CHAT = "/v1/chat/completions"
LONG = 1000  # tokens: the whole context of the tiny model, far longer than any wait below


def long_stream(port, max_tokens=LONG, **extra):
    body = {"model": sl.MODEL_NAME, "prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "logprobs": 0}
    body.update(extra)
    return sl.open_stream(port, COMP, body, timeout=300)


def abort_count(metrics):
    return metrics.get('moe:request_success_total{finished_reason="abort"}', 0)


def test_disconnect(binary, stall_engine):
    """A client leaves after three events. With stall_engine the engine is stopped (SIGSTOP) first, so
    no token comes to write and the server must see the closed socket by itself: the request is
    aborted, whatever the machine's load. With the engine running, the next token's write finds the
    socket closed; a starved server may see it only after the last token, so that case asserts that
    the request ends and its cache is freed, and says how it ended."""
    # As in sigterm_abort, the premise (the request still in flight when the engine stops) can fail
    # on a loaded machine: the tiny model makes its 1000 tokens in about a second.
    for _ in range(3):
        if disconnect_once(binary, stall_engine):
            return
        print("  the request had finished before the engine was stopped; again")
    raise sl.TestFailure("three times the request finished before the engine was stopped")


def disconnect_once(binary, stall_engine):
    """False if the stream ended before the engine was stopped, so nothing was tested."""
    with sl.Server(binary) as server:
        port = server.port
        engine = server.engine_pids()
        check(len(engine) == 1, f"engine processes: {engine}")
        before = server.metrics()
        conn, resp = long_stream(port)
        check(resp.status == 200, f"stream status {resp.status}")
        events = sl.sse_events(resp)
        for _ in range(3):
            next(events)
        if stall_engine:
            os.kill(engine[0], signal.SIGSTOP)
            # Take what was already on its way, so that the server is left waiting for a token.
            conn.sock.settimeout(1)
            try:
                if "[DONE]" in events:
                    os.kill(engine[0], signal.SIGCONT)
                    return False
            except TimeoutError:
                pass
        # Close the socket under the stream, as a client that goes away does.
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        if stall_engine:
            try:
                sl.wait_until(lambda: "the client disconnected" in server.log_text(), 30,
                              what="the server to notice the client is gone while no token comes")
            finally:
                os.kill(engine[0], signal.SIGCONT)
        lengths = 'moe:request_success_total{finished_reason="length"}'

        def settled():
            m = server.metrics()
            ended = abort_count(m) > abort_count(before) or m.get(lengths, 0) > before.get(lengths, 0)
            return m if ended and m.get("moe:num_requests_running") == 0 else None

        after = sl.wait_until(settled, 60, what="the disconnected request to end")
        aborted = abort_count(after) == abort_count(before) + 1
        generated = after["moe:generation_tokens_total"] - before.get("moe:generation_tokens_total", 0)
        if stall_engine:
            check(aborted, f"the request was not aborted: {abort_count(before)} -> {abort_count(after)} aborts")
        print(f"  {'aborted' if aborted else 'ran to its end'} after {int(generated)} of {LONG} tokens")
        check(after["moe:kv_cache_usage_perc"] == 0, f"KV cache not freed: {after['moe:kv_cache_usage_perc']}")
        # The server goes on serving.
        r = sl.post(port, COMP, {"prompt": "Hello", "max_tokens": 4})
        check(r.status == 200, f"after the disconnect: {r!r}")
    return True


def test_sigterm_grace(binary):
    server = sl.Server(binary, "--shutdown-grace", 120)
    with server:
        port = server.port
        children = server.children()
        check(len(children) == 2, f"expected an engine and an API server, got {children}")
        max_tokens = 300
        conn, resp = long_stream(port, max_tokens=max_tokens)
        check(resp.status == 200, f"stream status {resp.status}")
        events = sl.sse_events(resp)
        first = json.loads(next(events))
        check("choices" in first, f"first event {first}")
        server.proc.send_signal(signal.SIGTERM)
        # The stream goes on to its natural end.
        rest, usage, error, done = read_stream_from(events)
        conn.close()
        check(error is None, f"the in-flight request got an error during the grace period: {error}")
        check(done, "the stream did not end with [DONE]")
        check(usage and usage["completion_tokens"] == max_tokens, f"usage {usage}")
        check(rest[-1]["choices"][0]["finish_reason"] == "length", f"last chunk {rest[-1]}")
        code = server.proc.wait(60)
        check(code == 0, f"exit code {code} after SIGTERM")
        sl.wait_until(lambda: not any(sl.alive(p) for p in children), 10, what="the children to exit")
        check(not server.group_pids(), f"processes left behind: {server.group_pids()}")
        # Nobody listens any more.
        try:
            sl.get(port, "/health", timeout=5)
            raise sl.TestFailure("the port still answers after shutdown")
        except OSError:
            pass


def read_stream_from(events):
    chunks, usage, error, done = [], None, None, False
    for data in events:
        check(not done, "an event after [DONE]")
        if data == "[DONE]":
            done = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            error = obj["error"]
        elif obj.get("usage"):
            usage = obj["usage"]
        else:
            chunks.append(obj)
    return chunks, usage, error, done


def test_sigterm_abort(binary):
    # The premise, a request in flight when SIGTERM arrives, can fail on a loaded machine: the tiny
    # model makes its 1000 tokens in about a second, and the client may be descheduled that long
    # between its first event and the signal. The API server's log says which happened.
    for _ in range(3):
        if sigterm_abort_once(binary):
            return
        print("  the request had finished before SIGTERM reached the API server (0 requests in flight); again")
    raise sl.TestFailure("three times the request finished before SIGTERM reached the API server")


def sigterm_abort_once(binary):
    """False if the request was no longer in flight at SIGTERM, so nothing was tested."""
    server = sl.Server(binary, "--shutdown-grace", 0)
    with server:
        port = server.port
        children = server.children()
        conn, resp = long_stream(port)
        check(resp.status == 200, f"stream status {resp.status}")
        events = sl.sse_events(resp)
        next(events)
        server.proc.send_signal(signal.SIGTERM)
        chunks, usage, error, done = read_stream_from(events)
        conn.close()
        if error is None:
            server.proc.wait(60)
            if "API server shutting down: 0 requests in flight" in server.log_text():
                return False
        check(error is not None, f"no error event after SIGTERM with grace 0 ({len(chunks)} chunks, done={done})")
        check(set(error) == {"message", "type", "param", "code"}, f"error event shape {error}")
        check("shutting down" in error["message"], f"error message {error}")
        check(done, "the stream did not end with [DONE] after its error event")
        finished = [c for c in chunks if c["choices"][0]["finish_reason"]]
        check(not finished, f"the request finished normally instead of being aborted: {finished}")
        code = server.proc.wait(60)
        check(code == 0, f"exit code {code} after SIGTERM")
        sl.wait_until(lambda: not any(sl.alive(p) for p in children), 10, what="the children to exit")
        check(not server.group_pids(), f"processes left behind: {server.group_pids()}")
    return True


class Hammer:
    """Threads sending short requests over fresh connections, each result stamped with its start."""

    def __init__(self, port, threads=4):
        self.port = port
        self.results = []  # (start time, end time, status or exception text)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, i):
        n = 0
        while not self.stopped.is_set():
            start = time.monotonic()
            try:
                body = {"messages": [{"role": "user", "content": f"hammer {i} {n}"}], "max_tokens": 2}
                outcome = sl.post(self.port, CHAT, body, timeout=60).status
            except OSError as e:
                outcome = f"{type(e).__name__}: {e}"
            with self.lock:
                self.results.append((start, time.monotonic(), outcome))
            n += 1

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(120)

    def since(self, t):
        with self.lock:
            return [outcome for start, _, outcome in self.results if start >= t]

    def outside(self, windows):
        """Outcomes of the requests that overlap none of the (from, to) windows."""
        with self.lock:
            return [outcome for start, end, outcome in self.results
                    if not any(start < to and end >= since for since, to in windows)]


def kill_api_server(server, victim):
    """kill -9 of one API server; returns (when it was sent, when the process was gone)."""
    sent = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    sl.wait_until(lambda: sl.gone(victim), 10, interval=0.01, what="the API server to die")
    return sent, time.monotonic()


def test_api_crash(binary):
    with sl.Server(binary, api_servers=2) as server:
        port = server.port
        apis = sl.wait_until(lambda: (lambda a: a if len(a) == 2 else None)(server.api_pids()), 30,
                             what="two API servers")
        hammer = Hammer(port)
        try:
            sl.wait_until(lambda: len(hammer.since(0)) >= 10, 60, what="requests before the kill")
            # Requests that were inside the killed process fail; every other request succeeds
            # (the other API server takes them), also while the replacement starts.
            first_kill = kill_api_server(server, apis[0])
            dead = first_kill[1]
            first = sl.wait_until(
                lambda: (lambda a: a if len(a) == 2 and apis[0] not in a else None)(server.api_pids()), 30,
                what="a replacement API server")
            replacement = (set(first) - set(apis)).pop()
            check(apis[1] in first, f"the surviving API server changed: {apis} -> {first}")
            sl.wait_until(lambda: sl.listeners(port) == 2, 60, what="the replacement to listen")
            # The replacement serves: kill the other original one too, so that it is alone.
            sl.wait_until(lambda: len(hammer.since(dead)) >= 20, 60,
                          what="requests after the first kill")
            second_kill = kill_api_server(server, apis[1])
            sl.wait_until(lambda: len(hammer.since(second_kill[1])) >= 20, 60, what="requests after the second kill")
            final = sl.wait_until(
                lambda: (lambda a: a if len(a) == 2 and apis[1] not in a else None)(server.api_pids()), 30,
                what="a second replacement")
            check(replacement in final, f"the first replacement is gone: {final}")
        finally:
            hammer.stop()
        others = hammer.outside([first_kill, second_kill])
        failed = [o for o in others if o != 200]
        check(not failed, f"{len(failed)} of {len(others)} requests not in flight at a kill failed: {failed[:5]}")
        check(len(hammer.since(dead)) >= 40, "too few requests after the kills")
        at_kill = len(hammer.since(0)) - len(others)
        check(server.proc.poll() is None, "the supervisor exited")
        check(len(server.engine_pids()) == 1, "the engine must keep running")
        print(f"  {len(others)} requests served across two API-server kills; "
              f"{at_kill} in flight at a kill (those may fail)")


def test_engine_crash(binary, ranks=1, how=signal.SIGKILL):
    # The rank timeout is far below the engine timeout: a stopped rank must end the instance, not
    # merely go silent.
    with sl.Server(binary, "--engine-timeout", 30, "--ranks", ranks, "--rank-timeout", 3) as server:
        port = server.port
        engine = server.engine_pids()
        check(len(engine) == 1, f"engine processes: {engine}")
        # With ranks, the engine process is mpirun and the ranks its children: hit the last.
        victim = engine[0] if ranks == 1 else sl.proc_children(engine[0])[-1]
        conn, resp = long_stream(port)
        events = sl.sse_events(resp)
        next(events)
        os.kill(victim, how)
        # The stream in flight ends with an error, not a hang.
        chunks, usage, error, done = read_stream_from(events)
        conn.close()
        check(error is not None and error["code"] == "service_unavailable", f"in-flight stream error: {error}")
        check(done, "the failed stream did not end with [DONE]")
        # From now on: 503 with a message that says why.
        health = sl.wait_until(lambda: (lambda r: r if r.status == 503 else None)(sl.get(port, "/health", timeout=10)),
                               30, what="/health to answer 503")
        err = sl.check_error(health, 503, code="service_unavailable", what="/health")
        check("engine" in err["message"], f"/health message does not name the engine: {err}")
        for path, body in [(COMP, {"prompt": "x", "max_tokens": 2}),
                           (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
                           (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True})]:
            r = sl.post(port, path, body, timeout=30)
            err = sl.check_error(r, 503, code="service_unavailable", what=path)
            check("engine" in err["message"], f"503 message does not name the engine: {err}")
        r = sl.get(port, "/metrics", timeout=30)
        sl.check_error(r, 503, what="/metrics")
        check(server.proc.poll() is None, "the supervisor exited when the engine died")
        sl.wait_until(lambda: not server.engine_pids(), 30, what="the engine (every rank) to be gone")
        if how == signal.SIGSTOP:
            check("in a collective for another rank" in server.log_text(),
                  f"no rank reported the wait that ended it:\n{server.log_text()[-3000:]}")
        code = server.terminate_and_wait(60)
        check(code == 0, f"exit code {code} after SIGTERM with the engine gone")
        check(not server.group_pids(), f"processes left behind: {server.group_pids()}")


def run_expect_error(args, timeout=120):
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in (done.stdout + done.stderr).splitlines() if l.startswith("error:")]
    return done, lines


def test_startup_errors(binary):
    port = sl.free_port()
    cases = []
    # A model directory that does not exist.
    done, lines = run_expect_error([binary, "serve", "--model", "/nonexistent/model", "--port", str(port)])
    cases.append(("missing model dir", done, lines, "/nonexistent/model"))
    # A directory that is not a model.
    with __import__("tempfile").TemporaryDirectory() as empty:
        done, lines = run_expect_error([binary, "serve", "--model", empty, "--port", str(port)])
        cases.append(("empty model dir", done, lines, "config.json"))
    # A model directory with its config and tokenizer but no weights: the engine's error.
    with __import__("tempfile").TemporaryDirectory() as partial:
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(sl.DEFAULT_MODEL, name), partial)
        done, lines = run_expect_error([binary, "serve", "--model", partial, "--port", str(port)])
        cases.append(("model without weights", done, lines, partial))
    # A port in use.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        busy = s.getsockname()[1]
        done, lines = run_expect_error([binary, "serve", "--port", str(busy)])
        cases.append(("port in use", done, lines, str(busy)))
    # A host that is not an address of this machine.
    done, lines = run_expect_error([binary, "serve", "--host", "203.0.113.7", "--port", str(port)])
    cases.append(("foreign host", done, lines, "203.0.113.7"))
    failures = []
    for name, done, lines, mention in cases:
        problems = []
        if done.returncode == 0:
            problems.append("exit code 0")
        if len(lines) != 1:
            problems.append(f"{len(lines)} 'error:' lines")
        elif mention not in lines[0]:
            problems.append(f"the error line does not mention {mention!r}")
        status = "ok" if not problems else "FAIL " + ", ".join(problems)
        print(f"  {name}: exit {done.returncode}, {lines} -> {status}")
        if problems:
            failures.append(f"{name}: {problems}\n{done.stderr[-2000:]}")
    check(not failures, "\n".join(failures))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--case", action="append", help="run only these cases")
    args = parser.parse_args()
    b = args.binary
    cases = [
        ("disconnect", lambda: test_disconnect(b, stall_engine=True)),
        ("disconnect_running", lambda: test_disconnect(b, stall_engine=False)),
        ("sigterm_grace", lambda: test_sigterm_grace(b)),
        ("sigterm_abort", lambda: test_sigterm_abort(b)),
        ("api_crash", lambda: test_api_crash(b)),
        ("engine_crash", lambda: test_engine_crash(b)),
        ("rank_crash", lambda: test_engine_crash(b, ranks=2)),
        ("rank_hang", lambda: test_engine_crash(b, ranks=2, how=signal.SIGSTOP)),
        ("startup_errors", lambda: test_startup_errors(b)),
    ]
    sys.exit(sl.run_cases(cases, args.case))


if __name__ == "__main__":
    main()
