"""Bad input through real HTTP: each case asserts the status code and OpenAI's error shape
{"error":{"message","type","param","code"}}, and that /health still answers 200 afterwards (the
server stays up). Also: API-key handling, and a full waiting queue answering 429 with Retry-After."""
import argparse
import json
import socket
import sys
import threading
import time

import serverlib as sl
from serverlib import check, check_error

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "Hello"}]
JSON = {"Content-Type": "application/json"}


def chat(**fields):
    body = {"model": sl.MODEL_NAME, "messages": MSG, "max_tokens": 4}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not DROP}


def comp(**fields):
    body = {"model": sl.MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 4}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not DROP}


DROP = object()  # a field to leave out


def raw_post(port, path, payload, headers=None, timeout=60):
    """POST of raw bytes (or an object as JSON) with explicit headers."""
    if not isinstance(payload, (bytes, str)):
        payload = json.dumps(payload)
    return sl.request(port, "POST", path, payload, headers if headers is not None else JSON, timeout=timeout)


def post_huge_body(port, size):
    """POSTs `size` bytes to /v1/completions over a raw socket and returns (status, headers, body)
    of the answer. The server may answer before it has read the body and close the connection, so
    sending stops at the first error and the answer is read anyway."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        head = (f"POST {COMP} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\nConnection: close\r\n\r\n").encode()
        s.sendall(head)
        chunk = b'{"prompt":"' + b"a" * (1 << 16)
        sent = 0
        try:
            while sent < size:
                piece = chunk[:min(len(chunk), size - sent)]
                s.sendall(piece)
                sent += len(piece)
                chunk = b"a" * (1 << 16)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while True:
                part = s.recv(65536)
                if not part:
                    break
                data += part
        except ConnectionResetError:
            pass
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    check(lines and lines[0].startswith("HTTP/1.1 "), f"no HTTP answer to a {size}-byte body: {data[:200]!r}")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return sl.Response(status, headers, body)


def bad_input_cases(port):
    """(name, function returning a Response, expected status, expected param or None, expected
    code or None). A status of 200 means the request must succeed."""
    long_text = "the quick brown fox jumps over the lazy dog " * 400  # far beyond 1024 tokens
    cases = [
        # -- JSON itself --
        ("malformed JSON", lambda: raw_post(port, CHAT, b'{"model": "tiny-dsv3", "messages": ['), 400, None, None),
        ("empty body", lambda: raw_post(port, CHAT, b""), 400, None, None),
        ("body is a JSON array", lambda: raw_post(port, CHAT, b"[1, 2, 3]"), 400, None, None),
        ("body is a JSON string", lambda: raw_post(port, COMP, b'"hello"'), 400, None, None),
        ("deeply nested JSON", lambda: raw_post(port, CHAT, b"[" * 100000 + b"]" * 100000), 400, None, None),
        ("invalid UTF-8 bytes", lambda: raw_post(port, COMP, b'{"prompt": "abc\xff\xfe\xc3", "max_tokens": 2}'),
         400, None, None),
        ("lone UTF-16 surrogate escape", lambda: raw_post(port, COMP, b'{"prompt": "a\\ud800b", "max_tokens": 2}'),
         400, None, None),
        ("trailing garbage after JSON", lambda: raw_post(port, COMP, b'{"prompt": "a"} xyz'), 400, None, None),
        # -- messages --
        ("missing messages", lambda: raw_post(port, CHAT, chat(messages=DROP)), 400, "messages", None),
        ("empty messages array", lambda: raw_post(port, CHAT, chat(messages=[])), 400, "messages", None),
        ("messages is a string", lambda: raw_post(port, CHAT, chat(messages="hi")), 400, "messages", None),
        ("message is not an object", lambda: raw_post(port, CHAT, chat(messages=["hi"])), 400, "messages[0]", None),
        ("unknown role", lambda: raw_post(port, CHAT, chat(messages=[{"role": "wizard", "content": "x"}])),
         400, "messages[0].role", None),
        ("missing role", lambda: raw_post(port, CHAT, chat(messages=[{"content": "x"}])),
         400, "messages[0].role", None),
        ("missing content", lambda: raw_post(port, CHAT, chat(messages=[{"role": "user"}])),
         400, "messages[0].content", None),
        ("content is a number", lambda: raw_post(port, CHAT, chat(messages=[{"role": "user", "content": 5}])),
         400, "messages[0].content", None),
        ("content is an empty array", lambda: raw_post(port, CHAT, chat(messages=[{"role": "user", "content": []}])),
         400, "messages[0].content", None),
        ("image content part", lambda: raw_post(port, CHAT, chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])),
         400, "messages[0].content[0].type", None),
        ("empty string content is fine", lambda: raw_post(port, CHAT, chat(messages=[{"role": "user", "content": ""}])),
         200, None, None),
        # -- model --
        ("unknown model", lambda: raw_post(port, CHAT, chat(model="gpt-9")), 404, "model", "model_not_found"),
        ("model is a number", lambda: raw_post(port, COMP, comp(model=7)), 400, "model", None),
        # -- max_tokens --
        ("max_tokens 0", lambda: raw_post(port, COMP, comp(max_tokens=0)), 400, "max_tokens", None),
        ("max_tokens negative", lambda: raw_post(port, COMP, comp(max_tokens=-5)), 400, "max_tokens", None),
        ("max_tokens is a string", lambda: raw_post(port, COMP, comp(max_tokens="10")), 400, "max_tokens", None),
        ("max_tokens is fractional", lambda: raw_post(port, COMP, comp(max_tokens=1.5)), 400, "max_tokens", None),
        ("max_tokens 1e30", lambda: raw_post(port, COMP, b'{"prompt": "a", "max_tokens": 1e30}'),
         400, "max_tokens", None),
        ("max_completion_tokens 0", lambda: raw_post(port, CHAT, chat(max_tokens=DROP, max_completion_tokens=0)),
         400, "max_completion_tokens", None),
        ("min_tokens above max_tokens", lambda: raw_post(port, COMP, comp(max_tokens=2, min_tokens=5)),
         400, "min_tokens", None),
        # -- context length --
        ("prompt longer than the context", lambda: raw_post(port, COMP, comp(prompt=long_text)), 400, "prompt", None),
        ("chat longer than the context",
         lambda: raw_post(port, CHAT, chat(messages=[{"role": "user", "content": long_text}])), 400, "messages", None),
        ("prompt + max_tokens beyond the context", lambda: raw_post(port, COMP, comp(max_tokens=1024)),
         400, "max_tokens", None),
        # -- prompt --
        ("missing prompt", lambda: raw_post(port, COMP, comp(prompt=DROP)), 400, "prompt", None),
        ("prompt is an object", lambda: raw_post(port, COMP, comp(prompt={"a": 1})), 400, "prompt", None),
        ("prompt is an empty array", lambda: raw_post(port, COMP, comp(prompt=[])), 400, "prompt", None),
        ("token id beyond the vocabulary", lambda: raw_post(port, COMP, comp(prompt=[1, 2, 99999999])),
         400, "prompt", None),
        ("negative token id", lambda: raw_post(port, COMP, comp(prompt=[5, -1])), 400, "prompt[1]", None),
        ("fractional token id", lambda: raw_post(port, COMP, comp(prompt=[5, 1.5])), 400, "prompt[1]", None),
        ("batched prompts", lambda: raw_post(port, COMP, comp(prompt=["a", "b"])), 400, "prompt", None),
        ("echo", lambda: raw_post(port, COMP, comp(echo=True)), 400, "echo", None),
        # -- n --
        ("n 0", lambda: raw_post(port, COMP, comp(n=0)), 400, "n", None),
        ("n too large", lambda: raw_post(port, COMP, comp(n=1000)), 400, "n", None),
        ("n is a string", lambda: raw_post(port, CHAT, chat(n="2")), 400, "n", None),
        # -- sampling --
        ("temperature above 2", lambda: raw_post(port, CHAT, chat(temperature=3.5)), 400, "temperature", None),
        ("temperature negative", lambda: raw_post(port, CHAT, chat(temperature=-0.1)), 400, "temperature", None),
        ("temperature is a string", lambda: raw_post(port, CHAT, chat(temperature="hot")), 400, "temperature", None),
        ("top_p 0", lambda: raw_post(port, CHAT, chat(top_p=0)), 400, "top_p", None),
        ("top_p above 1", lambda: raw_post(port, COMP, comp(top_p=1.5)), 400, "top_p", None),
        ("top_k below -1", lambda: raw_post(port, COMP, comp(top_k=-2)), 400, "top_k", None),
        ("presence_penalty out of range", lambda: raw_post(port, COMP, comp(presence_penalty=3)),
         400, "presence_penalty", None),
        ("seed is a string", lambda: raw_post(port, COMP, comp(seed="abc")), 400, "seed", None),
        # -- stop --
        ("five stop strings", lambda: raw_post(port, COMP, comp(stop=["a", "b", "c", "d", "e"])), 400, "stop", None),
        ("empty stop string", lambda: raw_post(port, COMP, comp(stop="")), 400, "stop", None),
        ("stop is a number", lambda: raw_post(port, COMP, comp(stop=3)), 400, "stop", None),
        # -- streaming --
        ("stream is a string", lambda: raw_post(port, CHAT, chat(stream="yes")), 400, "stream", None),
        ("stream_options without stream", lambda: raw_post(port, CHAT, chat(stream_options={"include_usage": True})),
         400, "stream_options", None),
        ("stream_options.include_usage not a boolean",
         lambda: raw_post(port, CHAT, chat(stream=True, stream_options={"include_usage": 1})),
         400, "stream_options.include_usage", None),
        # -- logprobs --
        ("completions logprobs too large", lambda: raw_post(port, COMP, comp(logprobs=50)), 400, "logprobs", None),
        ("chat top_logprobs too large", lambda: raw_post(port, CHAT, chat(logprobs=True, top_logprobs=50)),
         400, "top_logprobs", None),
        ("top_logprobs without logprobs", lambda: raw_post(port, CHAT, chat(top_logprobs=3)),
         400, "top_logprobs", None),
        ("chat logprobs is an integer", lambda: raw_post(port, CHAT, chat(logprobs=5)), 400, "logprobs", None),
        # -- unsupported features say so --
        ("tools", lambda: raw_post(port, CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}])),
         400, "tools", None),
        ("logit_bias", lambda: raw_post(port, COMP, comp(logit_bias={"5": 10})), 400, "logit_bias", None),
        # -- ignored --
        ("unknown fields are ignored", lambda: raw_post(port, CHAT, chat(frobnicate=True, extra={"a": [1, 2]},
                                                                         user="u-1")), 200, None, None),
        ("null fields mean the default", lambda: raw_post(port, COMP, comp(temperature=None, n=None, stop=None)),
         200, None, None),
        # -- HTTP level --
        ("wrong content-type", lambda: raw_post(port, CHAT, chat(), {"Content-Type": "text/plain"}), 415, None, None),
        ("form content-type", lambda: raw_post(port, COMP, comp(),
                                                {"Content-Type": "application/x-www-form-urlencoded"}),
         415, None, None),
        ("GET on a POST route", lambda: sl.get(port, CHAT), 405, None, None),
        ("POST on a GET route", lambda: raw_post(port, "/v1/models", b"{}"), 405, None, None),
        ("unknown path", lambda: sl.get(port, "/v1/nothing-here"), 404, None, None),
        ("unknown POST path", lambda: raw_post(port, "/v1/embeddings", {"input": "x"}), 404, None, None),
        ("10 MB body", lambda: post_huge_body(port, 10 * 1024 * 1024), 413, None, "request_too_large"),
    ]
    return cases


def run_bad_input(binary):
    with sl.Server(binary) as server:
        port = server.port
        api_before = server.api_pids()
        cases = bad_input_cases(port)
        check(len(cases) >= 30, "the suite must hold at least 30 cases")
        failures = []
        for name, fn, status, param, code in cases:
            try:
                resp = fn()
                if status == 200:
                    check(resp.status == 200, f"expected 200, got {resp!r}")
                    body = resp.json()
                    check(body["choices"] and "usage" in body, f"bad completion {body}")
                else:
                    check_error(resp, status, param=param, code=code)
                    if status == 405:
                        check("allow" in resp.headers, f"405 without an Allow header: {resp.headers}")
                health = sl.get(port, "/health")
                check(health.status == 200, f"/health after the case: {health!r}")
                print(f"  ok   {name}: {resp.status}")
            except Exception as e:  # noqa: BLE001 - report all cases
                failures.append(f"{name}: {e}")
                print(f"  FAIL {name}: {e}")
        check(server.proc.poll() is None, "the server exited")
        check(server.api_pids() == api_before, f"API servers changed: {api_before} -> {server.api_pids()}")
        # And it still serves.
        r = raw_post(port, COMP, comp())
        check(r.status == 200, f"a good request after the bad ones: {r!r}")
        check(not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures))
        print(f"  {len(cases)} bad-input cases passed")


def run_api_key(binary):
    key = "sk-test-123"
    with sl.Server(binary, api_key=key) as server:
        port = server.port
        good = {"Authorization": f"Bearer {key}", **JSON}
        check_error(raw_post(port, CHAT, chat()), 401, code="invalid_api_key", what="no key")
        check_error(raw_post(port, CHAT, chat(), {"Authorization": "Bearer wrong", **JSON}), 401, what="wrong key")
        check_error(raw_post(port, CHAT, chat(), {"Authorization": key, **JSON}), 401, what="no Bearer scheme")
        check_error(raw_post(port, CHAT, chat(), {"Authorization": f"Basic {key}", **JSON}), 401, what="Basic")
        check_error(raw_post(port, CHAT, chat(), {"Authorization": f"Bearer {key}x", **JSON}), 401,
                    what="key with a suffix")
        check_error(sl.get(port, "/v1/models"), 401, what="models without key")
        check_error(sl.get(port, "/metrics"), 401, what="metrics without key")
        # A bad body is still 401 without a key: authentication comes first.
        check_error(raw_post(port, CHAT, b"{not json"), 401, what="bad body without key")
        check(sl.get(port, "/health").status == 200, "/health must work without a key")
        check(sl.get(port, "/v1/models", headers=good).status == 200, "models with the key")
        check(sl.get(port, "/metrics", headers=good).status == 200, "metrics with the key")
        r = raw_post(port, CHAT, chat(), good)
        check(r.status == 200, f"chat with the key: {r!r}")
        check_error(raw_post(port, CHAT, b"{not json", good), 400, what="bad body with the key")


def run_queue_full(binary):
    """--max-waiting 1 --max-num-seqs 1: one request runs, one waits, the rest get 429."""
    with sl.Server(binary, "--max-waiting", 1, "--max-num-seqs", 1) as server:
        port = server.port
        results = []
        lock = threading.Lock()

        def one(i, max_tokens=300):
            body = comp(prompt=f"Request {i}: tell me a story", max_tokens=max_tokens, ignore_eos=True)
            r = raw_post(port, COMP, body, timeout=600)  # a hang guard: a loaded CI machine is slow
            with lock:
                results.append((max_tokens, r))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        check(len(results) == len(threads), "some flood requests did not return")
        statuses = sorted(r.status for _, r in results)
        ok = [r for _, r in results if r.status == 200]
        limited = [r for _, r in results if r.status == 429]
        check(len(ok) + len(limited) == len(results), f"only 200 and 429 expected, got {statuses}")
        check(len(ok) >= 1, f"some requests must be served: {statuses}")
        check(len(limited) >= 1, f"a full queue must answer 429: {statuses}")
        for r in limited:
            check_error(r, 429, type_="rate_limit_error", what="queue full")
            check(r.headers.get("retry-after", "").isdigit(), f"429 without Retry-After: {r.headers}")
        for r in ok:
            check(r.json()["usage"]["completion_tokens"] == 300, f"served request cut short: {r.body[:200]}")

        # A full queue must reject a streaming request too, with an HTTP 429 before any event.
        # Blockers keep it full (one runs, one waits); the tiny model finishes a blocker in about a
        # second, so the queue can drain between the metrics check and the stream: try again then.
        results.clear()
        stop = threading.Event()

        def keep_full():
            while not stop.is_set():
                one(len(results), 1000)
                time.sleep(0.05)

        blockers = [threading.Thread(target=keep_full) for _ in range(3)]
        for t in blockers:
            t.start()
        err = None
        for _ in range(20):
            sl.wait_until(lambda: server.metrics().get("moe:num_requests_waiting", 0) >= 1, 60,
                          what="a waiting request")
            conn, resp = sl.open_stream(port, COMP, comp(stream=True, max_tokens=5))
            body = resp.read()
            conn.close()
            if resp.status != 200:
                err = sl.Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
                break
        stop.set()
        for t in blockers:
            t.join(300)
        if err is None:
            raise sl.TestFailure(f"streaming requests to a full queue got 200 every time; expected 429")
        check_error(err, 429, type_="rate_limit_error", what="stream to a full queue")
        check(err.headers.get("retry-after", "").isdigit(), f"streamed 429 without Retry-After: {err.headers}")
        check(all(r.status in (200, 429) for _, r in results), f"the blocking requests: {results}")
        check(any(r.status == 200 for _, r in results), f"no blocking request was served: {results}")
        check(sl.get(port, "/health").status == 200, "/health after the flood")
        r = raw_post(port, COMP, comp())
        check(r.status == 200, f"a request after the flood: {r!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--case", action="append", help="run only these cases")
    args = parser.parse_args()
    cases = [
        ("bad_input", lambda: run_bad_input(args.binary)),
        ("api_key", lambda: run_api_key(args.binary)),
    ]
    # Filling the queue needs blockers that outlast the probes; under a sanitizer every step is
    # several times slower and the case races its own timeouts. The main suite runs it.
    if not sl.is_sanitized(args.binary):
        cases.append(("queue_full", lambda: run_queue_full(args.binary)))
    sys.exit(sl.run_cases(cases, args.case))


if __name__ == "__main__":
    main()
