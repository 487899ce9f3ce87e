"""Shared harness for the server integration tests: starts `moe-serve serve` on a free port, waits
for /health with a bounded timeout, and always stops it (SIGTERM, then SIGKILL of its whole process
group), so that no process outlives a test even when it fails. Plain HTTP helpers, an SSE reader,
a /metrics parser and /proc helpers (children, RSS) go with it. Python standard library only."""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_MODEL = os.path.join(REPO, "models", "tiny-dsv3")
MODEL_NAME = "tiny-dsv3"
STARTUP_TIMEOUT_S = 120


class TestFailure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise TestFailure(message)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count):
    """The first of `count` consecutive ports that are all free now, below the kernel's ephemeral
    range (where outgoing connections of parallel tests would take ports from under us)."""
    import random
    for _ in range(1000):
        base = random.randrange(20000, 30000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise TestFailure(f"no {count} consecutive free ports in 20000-30000")


# ---- /proc ----

def proc_children(pid):
    """Pids whose parent is `pid` (read from /proc, as `ps --ppid` does)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return sorted(out)


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def role_of(pid):
    args = proc_cmdline(pid)
    for i, a in enumerate(args[:-1]):
        if a == "--role":
            return args[i + 1]
    return None


def proc_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        return False


def gone(pid):
    """The process has exited and been reaped: every thread is gone and its sockets are closed
    (a killed process's main thread shows as a zombie while other threads still hold its files)."""
    return not os.path.exists(f"/proc/{pid}")


def group_members(pgid):
    """Every live process of process group `pgid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) == pgid and alive(int(entry)):
                out.append(int(entry))
        except OSError:
            pass
    return out


def listeners(port):
    """How many sockets listen on TCP `port` (IPv4): one per API server with SO_REUSEPORT."""
    count = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                count += 1
    return count


def wait_until(predicate, timeout, interval=0.1, what="a condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TestFailure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---- HTTP ----

def is_sanitized(binary):
    """Whether `binary` is built with AddressSanitizer (linked against libasan)."""
    done = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return "libasan" in done.stdout


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"HTTP {self.status} {self.body[:300]!r}"


def request(port, method, path, body=None, headers=None, timeout=60, host="127.0.0.1"):
    """One request on a fresh connection. `body`: bytes, str, or an object sent as JSON."""
    headers = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def post(port, path, body, headers=None, timeout=120):
    return request(port, "POST", path, body, headers, timeout)


def get(port, path, headers=None, timeout=60):
    return request(port, "GET", path, None, headers, timeout)


def open_stream(port, path, body, headers=None, timeout=120):
    """Starts a streaming POST; returns (connection, response) with the body not yet read."""
    headers = dict(headers or {})
    headers.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    return conn, conn.getresponse()


def sse_events(resp):
    """Yields the payload of each `data:` event of an SSE response, as strings, until it ends."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode()
        if line in ("\n", "\r\n"):
            continue
        if not line.startswith("data: "):
            raise TestFailure(f"SSE line is not a data event: {line!r}")
        blank = resp.readline()
        if blank not in (b"\n", b"\r\n"):
            raise TestFailure(f"SSE event {line!r} is not followed by a blank line but by {blank!r}")
        yield line[len("data: "):].rstrip("\r\n")


def check_error(resp, status, param=None, code=None, type_=None, what=""):
    """The response has `status` and OpenAI's error shape {"error":{message,type,param,code}}."""
    label = f"{what}: " if what else ""
    check(resp.status == status, f"{label}expected HTTP {status}, got {resp!r}")
    check(resp.headers.get("content-type", "").startswith("application/json"),
          f"{label}error content-type is {resp.headers.get('content-type')!r}")
    try:
        body = resp.json()
    except ValueError:
        raise TestFailure(f"{label}error body is not JSON: {resp.body[:300]!r}")
    check(isinstance(body, dict) and list(body.keys()) == ["error"], f"{label}error body shape: {body}")
    err = body["error"]
    check(set(err.keys()) == {"message", "type", "param", "code"}, f"{label}error fields: {err}")
    check(isinstance(err["message"], str) and err["message"], f"{label}error message empty: {err}")
    check(isinstance(err["type"], str) and err["type"], f"{label}error type: {err}")
    check(err["param"] is None or isinstance(err["param"], str), f"{label}error param: {err}")
    check(err["code"] is None or isinstance(err["code"], str), f"{label}error code: {err}")
    if param is not None:
        check(err["param"] == param, f"{label}expected param {param!r}, got {err}")
    if code is not None:
        check(err["code"] == code, f"{label}expected code {code!r}, got {err}")
    if type_ is not None:
        check(err["type"] == type_, f"{label}expected type {type_!r}, got {err}")
    return err


def parse_metrics(text):
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


# ---- The server ----

def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies, even by SIGKILL (a ctest
    timeout), so that no server outlives its test."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort: stop() remains the main line of defence
        pass


class Server:
    """`moe-serve serve` on a free port. Use as a context manager: it is always stopped."""

    def __init__(self, binary, *extra, model=DEFAULT_MODEL, api_servers=1, api_key=None, port=None,
                 wait=True, startup_timeout=STARTUP_TIMEOUT_S):
        self.binary = binary
        self.port = port or free_port()
        self.api_key = api_key
        self.args = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(self.port),
                     "--api-servers", str(api_servers)]
        if api_key:
            self.args += ["--api-key", api_key]
        self.args += [str(a) for a in extra]
        self.log = tempfile.NamedTemporaryFile(prefix="moe-serve-test-", suffix=".log", delete=False)
        self.proc = None
        self.wait = wait
        self.startup_timeout = startup_timeout
        self.pgid = None

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind, value, tb):
        self.stop()
        if kind is not None:
            self.dump_log()
        return False

    def start(self):
        # Its own process group: the stop below reaches every child even if the supervisor is gone.
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        self.pgid = self.proc.pid
        if self.wait:
            self.wait_healthy(self.startup_timeout)

    @property
    def pid(self):
        return self.proc.pid

    def auth(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_healthy(self, timeout):
        """Until /health says 200 twenty times in a row: the API servers share the port, each
        connection goes to one of them, and each becomes ready on its own."""
        deadline = time.monotonic() + timeout
        last = None
        healthy_in_a_row = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TestFailure(f"moe-serve exited with {self.proc.returncode} before becoming healthy:\n"
                                  + self.log_text()[-4000:])
            try:
                last = get(self.port, "/health", timeout=5)
                healthy_in_a_row = healthy_in_a_row + 1 if last.status == 200 else 0
                if healthy_in_a_row == 20:
                    return
                if last.status == 200:
                    continue
            except OSError as e:
                last = e
                healthy_in_a_row = 0
            time.sleep(0.2)
        raise TestFailure(f"moe-serve not healthy after {timeout} s (last: {last!r}):\n" + self.log_text()[-4000:])

    def children(self):
        return proc_children(self.pid)

    def api_pids(self):
        return [p for p in self.children() if role_of(p) == "api"]

    def engine_pids(self):
        return [p for p in self.children() if role_of(p) == "engine"]

    def rss_kib(self):
        """Resident memory of the supervisor's children (engine + API servers)."""
        return sum(proc_rss_kib(p) for p in self.children())

    def metrics(self):
        r = get(self.port, "/metrics", headers=self.auth())
        check(r.status == 200, f"/metrics: {r!r}")
        return parse_metrics(r.body.decode())

    def group_pids(self):
        """Every live process of the server's process group."""
        return group_members(self.pgid)

    def terminate_and_wait(self, timeout):
        """SIGTERM to the supervisor; its exit code, or None if it did not exit in time."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=30):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"moe-serve did not stop {timeout} s after SIGTERM; killing it", file=sys.stderr)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)

    def log_text(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def dump_log(self):
        print(f"---- moe-serve log ({self.log.name}) ----", file=sys.stderr)
        print(self.log_text()[-8000:], file=sys.stderr)
        print("---- end of log ----", file=sys.stderr)


def run_cases(cases, selected=None):
    """Runs (name, fn) pairs, prints PASS/FAIL for each, and returns the process exit code."""
    # SIGTERM (ctest, a CI runner) unwinds like an error, so every server is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failed = []
    for name, fn in cases:
        if selected and name not in selected:
            continue
        start = time.monotonic()
        try:
            fn()
            print(f"PASS {name} ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed.append(name)
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
    if failed:
        print(f"{len(failed)} failed: {', '.join(failed)}")
        return 1
    print("all passed")
    return 0


def run_main(name, run):
    """The main of a test with one case: `run(binary)` against --binary."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    sys.exit(run_cases([(name, lambda: run(args.binary))]))
