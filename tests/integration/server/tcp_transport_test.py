#!/usr/bin/python3
"""API servers and the engine on different hosts: the engine runs alone (--api-servers 0) with
its ZeroMQ sockets on TCP (--engine-port), and API servers started separately reach it with
--connect-engine. Here both sides run on this host, over TCP on loopback. Answers are the same as
with the IPC sockets of a single server; a gone engine turns into 503s; bad flags are refused."""

import argparse
import concurrent.futures
import subprocess
import sys

import serverlib as sl
from serverlib import check

BODIES = [{"prompt": f"The {word} said that", "max_tokens": 8 + i, "temperature": 0, "ignore_eos": True}
          for i, word in enumerate(["president", "city", "river", "old dog", "council", "team"])]


def complete_all(port):
    with concurrent.futures.ThreadPoolExecutor(len(BODIES)) as pool:
        responses = list(pool.map(lambda body: sl.post(port, "/v1/completions", body), BODIES))
    for r in responses:
        check(r.status == 200, f"{r!r}")
    return [r.json()["choices"][0]["text"] for r in responses]


def engine_only(binary, engine_port, *extra):
    """A headless engine: it has no HTTP port, so it is ready once every rank says where it listens."""
    return sl.Server(binary, "--engine-port", engine_port, *extra, api_servers=0, wait=False)


def wait_listening(engine, ranks):
    sl.wait_until(lambda: engine.log_text().count("listening on tcp://") == ranks
                  or engine.proc.poll() is not None, sl.STARTUP_TIMEOUT_S, what="the engine's TCP sockets")
    check(engine.proc.poll() is None, f"the engine exited:\n{engine.log_text()[-3000:]}")


def reference_texts(binary):
    with sl.Server(binary) as server:
        return complete_all(server.port)


def case_remote_engine(binary, reference):
    """One rank over TCP gives the IPC answers; once the engine stops, the API server says 503,
    until an engine is back."""
    port = sl.free_ports(2)
    with engine_only(binary, port) as engine:
        wait_listening(engine, 1)
        with sl.Server(binary, "--connect-engine", f"127.0.0.1:{port}", "--engine-timeout", 3) as api:
            check(complete_all(api.port) == reference, "TCP and IPC answers differ")
            check(engine.terminate_and_wait(60) == 0, "the headless engine exits 0 on SIGTERM")
            health = sl.wait_until(lambda: (lambda r: r if r.status == 503 else None)(sl.get(api.port, "/health")),
                                   30, what="/health to turn 503 once the engine is gone")
            sl.check_error(health, 503, what="/health without the engine")
            sl.check_error(sl.post(api.port, "/v1/completions", BODIES[0]), 503, what="a request without the engine")
            # An engine started again on the same port is found without restarting the API server.
            with engine_only(binary, port) as again:
                wait_listening(again, 1)
                sl.wait_until(lambda: sl.get(api.port, "/health").status == 200, 60, what="/health 200 again")
                check(complete_all(api.port) == reference, "the restarted engine answers differently")


def case_two_ranks(binary, reference):
    """Two ranks, each on its own pair of ports, both listed by the API servers."""
    port = sl.free_ports(4)
    with engine_only(binary, port, "--ranks", 2) as engine:
        wait_listening(engine, 2)
        addresses = f"127.0.0.1:{port},127.0.0.1:{port + 2}"
        with sl.Server(binary, "--connect-engine", addresses, api_servers=2) as api:
            check(complete_all(api.port) == reference, "two ranks over TCP answer differently from one over IPC")
            metrics = sl.parse_metrics(sl.get(api.port, "/metrics").body.decode())
            for rank in (0, 1):
                served = sum(v for k, v in metrics.items() if k.startswith(f'moe:request_success_total{{rank="{rank}"'))
                check(served > 0, f"rank {rank} served no request: {metrics}")


def case_bad_flags(binary):
    model = sl.DEFAULT_MODEL
    for args, message in [
        (["--api-servers", "0"], "--api-servers 0: the engine needs --engine-port"),
        (["--connect-engine", "localhost"], "--connect-engine: 'localhost' is not HOST:PORT"),
        (["--connect-engine", "h:1,h:70000"], "--connect-engine: 'h:70000' is not HOST:PORT"),
        (["--connect-engine", "h:5600", "--engine-port", "5600"], "--engine-port and --ranks do not apply"),
        (["--connect-engine", "h:5600", "--api-servers", "0"], "--api-servers must be at least 1"),
        (["--engine-port", "65530", "--ranks", "4"], "4 ranks need ports up to 65537"),
    ]:
        done = subprocess.run([binary, "serve", "--model", model, *args], capture_output=True, text=True, timeout=60)
        check(done.returncode != 0, f"{args}: exit status 0")
        check(message in done.stderr, f"{args}: stderr {done.stderr!r} lacks {message!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    reference = []
    cases = [
        ("reference_over_ipc", lambda: reference.extend(reference_texts(args.binary))),
        ("remote_engine", lambda: case_remote_engine(args.binary, reference)),
        ("two_ranks", lambda: case_two_ranks(args.binary, reference)),
        ("bad_flags", lambda: case_bad_flags(args.binary)),
    ]
    sys.exit(sl.run_cases(cases))


if __name__ == "__main__":
    main()
