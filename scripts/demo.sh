#!/usr/bin/env bash
# The main job: installs dependencies, builds moe-serve and generates text with the default model
# (the tiny DeepSeek-V3 in models/, trained on the Brown corpus). Extra arguments go to `generate`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja
cmake --build build -j "$(nproc)" --target moe-serve

if (($# == 0)); then
  set -- --prompt "The president said that" --max-tokens 40 --temperature 0
fi
build/moe-serve generate "$@"
