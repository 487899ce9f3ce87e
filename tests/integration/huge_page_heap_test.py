"""moe-serve runs itself again with glibc's malloc set to back the heap with transparent huge pages
(GLIBC_TUNABLES glibc.malloc.hugetlb=1), keeping tunables already set and leaving a hugetlb value
the user chose, and works the same after: each case starts the real binary on the bundled model with
`generate --input-file` reading stdin, reads the running process's environment, then feeds it one
request and expects one result line."""
import argparse
import json
import os
import subprocess
import sys
import time


def environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def run_case(binary, tunables, expected):
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    proc = subprocess.Popen([binary, "generate", "--input-file", "/dev/stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # The exec, if any, comes first thing in main, long before the process has read its input.
        time.sleep(1)
        deadline = time.monotonic() + 30
        seen = environment(proc.pid).get("GLIBC_TUNABLES")
        while seen != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = environment(proc.pid).get("GLIBC_TUNABLES")
        assert seen == expected, f"GLIBC_TUNABLES {tunables!r}: the process has {seen!r}, expected {expected!r}"
        out, err = proc.communicate(json.dumps({"prompt": "Once upon a time", "max_tokens": 2}) + "\n", timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"GLIBC_TUNABLES {tunables!r}: exit {proc.returncode}\n{err}"
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "text" in json.loads(lines[0]), f"expected one result line, got {out!r}"
    print(f"ok: GLIBC_TUNABLES {tunables!r} -> {expected!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    run_case(args.binary, None, "glibc.malloc.hugetlb=1")
    # glibc, parsing the tunables at start-up, cuts the process's own copy of the variable (the one
    # /proc shows) at the first ':', so this case sees only that the user's tunable is still first.
    run_case(args.binary, "glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2")
    run_case(args.binary, "glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0")


if __name__ == "__main__":
    sys.exit(main())
