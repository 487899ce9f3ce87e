#!/usr/bin/env bash
# Runs every test: installs dependencies, builds, runs the whole ctest suite, runs the safetensors
# header fuzzer for a bounded time, and reruns the tensor, loader, tokenizer and server tests under
# ASan+UBSan (the server's request-level integration tests start the sanitized moe-serve).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DMOE_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

bash scripts/fuzz.sh 60

cmake -S . -B build-asan -G Ninja -DMOE_WERROR=ON -DMOE_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j "$jobs" --target tensor_test model_loader_test tokenizer_test tokenizer_golden_test \
  moe-serve openai_protocol_test stop_matcher_test engine_messages_test metrics_test
# The process-management and load tests (kills, restarts, timings, MPI) run in the main suite only.
ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "tensor|loader|tokenizer|server" \
  -E "server_(lifecycle|load|expert_parallel|tcp_transport)|bench_serve"
