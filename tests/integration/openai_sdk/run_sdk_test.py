"""Runs sdk_test.mjs (the official OpenAI Node SDK, npm `openai` pinned in package.json) against
real `moe-serve serve` instances: one without a key, one started with --api-key. Installs the pinned
npm packages first when they are missing (npm ci from package-lock.json, as the tokenizer goldens
do). Without node and npm the test fails: it is never skipped."""
import argparse
import fcntl
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
import serverlib as sl  # noqa: E402


def install_sdk():
    for program in ("node", "npm"):
        if not shutil.which(program):
            sys.exit(f"run_sdk_test.py: '{program}' not found: the OpenAI SDK test needs Node.js and npm "
                     "(scripts/install-deps.sh installs them)")
    # Several build trees may run their tests at once; the lock keeps them from running npm ci in
    # the same folder together.
    with open(os.path.join(HERE, "package.json")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(HERE, "node_modules", "openai", "package.json")):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=600)


def run_node(server, api_key=None):
    args = ["node", os.path.join(HERE, "sdk_test.mjs"), f"http://127.0.0.1:{server.port}/v1", sl.MODEL_NAME]
    if api_key:
        args.append(api_key)
    done = subprocess.run(args, cwd=HERE, timeout=600)
    sl.check(done.returncode == 0, f"sdk_test.mjs failed (exit {done.returncode})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    install_sdk()

    def without_key():
        with sl.Server(args.binary, api_servers=2) as server:
            run_node(server)
            sl.check(server.proc.poll() is None, "the server exited")

    def with_key():
        key = "sk-moe-serve-test"
        with sl.Server(args.binary, api_key=key) as server:
            run_node(server, key)

    sys.exit(sl.run_cases([("openai_sdk", without_key), ("openai_sdk_api_key", with_key)]))


if __name__ == "__main__":
    main()
