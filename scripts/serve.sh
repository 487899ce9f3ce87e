#!/usr/bin/env bash
# The main job: installs dependencies, builds moe-serve and starts the OpenAI-compatible server on
# the default model (the tiny DeepSeek-V3 in models/, trained on the Brown corpus) at
# http://127.0.0.1:8000. Extra arguments go to `serve` (e.g. --port 8001 --api-servers 2).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja
cmake --build build -j "$(nproc)" --target moe-serve

exec build/moe-serve serve "$@"
