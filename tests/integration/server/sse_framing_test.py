"""curl checks the raw SSE framing of streamed completions: `data: {json}\\n\\n` events, a final
`data: [DONE]\\n\\n`, Content-Type text/event-stream, each event valid JSON, one choice per chunk,
finish_reason only on the last chunk of each choice, and the token counts matching usage."""
import json
import os
import subprocess
import sys
import tempfile

import serverlib as sl
from serverlib import check


def curl(port, path, body, headers=()):
    """Runs curl; returns (status, headers dict, raw body bytes) exactly as they came."""
    with tempfile.TemporaryDirectory() as d:
        head_file = os.path.join(d, "headers")
        args = ["curl", "-sS", "-N", "--max-time", "120", "-D", head_file, "-X", "POST",
                f"http://127.0.0.1:{port}{path}", "-H", "Content-Type: application/json",
                "--data-binary", json.dumps(body)]
        for h in headers:
            args += ["-H", h]
        done = subprocess.run(args, capture_output=True, timeout=180)
        check(done.returncode == 0, f"curl failed ({done.returncode}): {done.stderr.decode()}")
        with open(head_file, "rb") as f:
            head = f.read().decode()
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, done.stdout


def split_events(raw):
    """The SSE body as a list of event payloads; fails on any framing error."""
    text = raw.decode("utf-8")  # the stream itself must be valid UTF-8
    check(text.endswith("data: [DONE]\n\n"), f"stream does not end with 'data: [DONE]\\n\\n': {text[-200:]!r}")
    check(text.startswith("data: "), f"stream does not start with an event: {text[:200]!r}")
    parts = text.split("\n\n")
    check(parts[-1] == "", "trailing bytes after the last event")
    events = []
    for part in parts[:-1]:
        check("\n" not in part and "\r" not in part, f"an event spans several lines: {part!r}")
        check(part.startswith("data: "), f"not a data event: {part!r}")
        events.append(part[len("data: "):])
    check(events[-1] == "[DONE]", "last event is not [DONE]")
    check(events.count("[DONE]") == 1, "[DONE] appears more than once")
    return events[:-1]


def check_stream(port, path, body, chat, n, max_tokens):
    status, headers, raw = curl(port, path, body)
    check(status == 200, f"status {status}: {raw[:300]!r}")
    check(headers.get("content-type", "").startswith("text/event-stream"),
          f"Content-Type is {headers.get('content-type')!r}")
    events = split_events(raw)
    chunks = []
    for e in events:
        try:
            chunks.append(json.loads(e))
        except ValueError:
            raise sl.TestFailure(f"event is not valid JSON: {e!r}")
    include_usage = body.get("stream_options", {}).get("include_usage", False)
    usage = None
    if include_usage:
        usage_chunk = chunks.pop()
        check(usage_chunk["choices"] == [], f"the usage chunk must have no choices: {usage_chunk}")
        usage = usage_chunk["usage"]
        check(set(usage) >= {"prompt_tokens", "completion_tokens", "total_tokens"}, f"usage fields: {usage}")
        check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], f"usage sum: {usage}")
    check(chunks, "no chunks before [DONE]")
    ids = {c["id"] for c in chunks}
    check(len(ids) == 1, f"chunks of one response carry different ids: {ids}")
    expected_object = "chat.completion.chunk" if chat else "text_completion"
    finished = {}
    texts = {i: "" for i in range(n)}
    tokens = {i: 0 for i in range(n)}
    first_seen = set()
    for c in chunks:
        check(c["object"] == expected_object, f"object {c['object']!r}")
        check(c["model"] == sl.MODEL_NAME, f"model {c['model']!r}")
        check(isinstance(c["created"], int), "created is not an integer")
        check(len(c["choices"]) == 1, f"a chunk must hold exactly one choice: {c}")
        if include_usage:
            check("usage" in c and c["usage"] is None, f"chunks before the usage chunk carry usage: null: {c}")
        choice = c["choices"][0]
        i = choice["index"]
        check(0 <= i < n, f"choice index {i} out of range")
        check(i not in finished, f"choice {i} has a chunk after its finish_reason: {c}")
        if chat:
            delta = choice["delta"]
            if i not in first_seen:
                check(delta.get("role") == "assistant", f"first chunk of choice {i} lacks role: {c}")
            else:
                check("role" not in delta, f"role repeated in a later chunk: {c}")
            texts[i] += delta.get("content") or ""
            if choice.get("logprobs"):
                tokens[i] += len(choice["logprobs"]["content"])
        else:
            texts[i] += choice["text"]
            if choice.get("logprobs"):
                lp = choice["logprobs"]
                tokens[i] += len(lp["tokens"])
                check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
                      == len(lp["text_offset"]), f"logprobs arrays differ in length: {lp}")
        first_seen.add(i)
        if choice["finish_reason"] is not None:
            check(choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']!r}")
            finished[i] = choice["finish_reason"]
    check(sorted(finished) == list(range(n)), f"not every choice finished: {finished}")
    if body.get("logprobs"):
        for i in range(n):
            if finished[i] == "length":
                check(tokens[i] == max_tokens, f"choice {i}: {tokens[i]} tokens with logprobs, max_tokens {max_tokens}")
        if usage is not None:
            check(sum(tokens.values()) == usage["completion_tokens"],
                  f"tokens streamed {tokens} vs usage {usage}")
    elif usage is not None and all(r == "length" for r in finished.values()):
        check(usage["completion_tokens"] == n * max_tokens, f"usage {usage} for n={n}, max_tokens={max_tokens}")
    return texts, finished, usage


def nonstream(port, path, body):
    status, headers, raw = curl(port, path, body)
    check(status == 200, f"status {status}: {raw[:300]!r}")
    check(headers.get("content-type", "").startswith("application/json"), f"content-type {headers}")
    return json.loads(raw)


def run(binary):
    with sl.Server(binary) as server:
        port = server.port
        # Chat, one choice, usage at the end.
        body = {"model": sl.MODEL_NAME, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 24, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                "temperature": 0}
        texts, finished, usage = check_stream(port, "/v1/chat/completions", body, chat=True, n=1, max_tokens=24)
        check(usage["completion_tokens"] == 24 and finished[0] == "length", f"{usage} {finished}")
        # The same request unstreamed gives the same text (greedy).
        plain = dict(body)
        del plain["stream"], plain["stream_options"]
        full = nonstream(port, "/v1/chat/completions", plain)
        check(full["choices"][0]["message"]["content"] == texts[0],
              f"streamed {texts[0]!r} vs non-streamed {full['choices'][0]['message']['content']!r}")
        print("  chat stream ok")

        # Completions, n=2, logprobs: token counts per choice match usage.
        body = {"model": sl.MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 16, "n": 2, "logprobs": 2,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": 7,
                "temperature": 1.0}
        check_stream(port, "/v1/completions", body, chat=False, n=2, max_tokens=16)
        print("  completions n=2 logprobs stream ok")

        # Chat, n=3, logprobs, without usage.
        body = {"model": sl.MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "n": 3,
                "logprobs": True, "top_logprobs": 2, "stream": True, "ignore_eos": True}
        check_stream(port, "/v1/chat/completions", body, chat=True, n=3, max_tokens=10)
        print("  chat n=3 stream ok")

        # A stop string ends the choice with finish_reason "stop" and is not part of the text.
        greedy = {"model": sl.MODEL_NAME, "prompt": "The little dog", "max_tokens": 40, "temperature": 0,
                  "ignore_eos": True}
        text = nonstream(port, "/v1/completions", greedy)["choices"][0]["text"]
        stop = text[len(text) // 2:len(text) // 2 + 3]
        check(stop.strip(), f"greedy text too short to pick a stop string: {text!r}")
        body = dict(greedy, stream=True, stop=[stop])
        texts, finished, _ = check_stream(port, "/v1/completions", body, chat=False, n=1, max_tokens=40)
        check(finished[0] == "stop", f"finish_reason with a stop string: {finished}")
        check(texts[0] == text[:text.find(stop)], f"stopped text {texts[0]!r}, expected {text[:text.find(stop)]!r}")
        print("  stop string stream ok")

        # An error before streaming starts is plain JSON, not SSE.
        status, headers, raw = curl(port, "/v1/completions", {"prompt": "x", "max_tokens": 0, "stream": True})
        check(status == 400 and headers.get("content-type", "").startswith("application/json"),
              f"bad streamed request: {status} {headers} {raw[:200]!r}")
        check(sl.get(port, "/health").status == 200, "/health at the end")


if __name__ == "__main__":
    sl.run_main("sse_framing", run)
