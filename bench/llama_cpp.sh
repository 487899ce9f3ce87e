#!/bin/bash
# llama.cpp on the bench model, on this machine: the peer the kernels issue measures us against.
#
# The machine reaches only Debian's and npm's registries, so llama.cpp comes from npm:
# node-llama-cpp ships the llama.cpp release it binds as a git bundle. Its own benchmark tools
# are built from that source (-march=native) and run on our bench model converted to Q8_0 by
# tools/gguf_from_checkpoint.py, with 2 threads:
#   llama-bench          prefill of 512 tokens (pp512) and batch-1 decode of 64 tokens (tg64);
#   llama-batched-bench  1, 4, 16 and 32 sequences of 128 prompt tokens generating 64 each:
#                        S_TG is decode tok/s over all sequences, S_PP the prompts' tok/s.
#
#   bench/llama_cpp.sh [--prepare] [BUILD_DIR]   (default build-bench; bench-3b must exist there:
#                                                e2e.py)
# --prepare builds llama.cpp and converts the model, then prints the two paths bench/vs_llama.py
# needs (the tools' directory and the GGUF) instead of checking and measuring.
set -euo pipefail

PREPARE=0
if [[ ${1:-} == --prepare ]]; then
  PREPARE=1
  shift
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build-bench}")
MODEL=$BUILD/models/bench-3b
WORK=$BUILD/llama.cpp
NODE_LLAMA_CPP=3.22.1
THREADS=${THREADS:-2}

[[ -f $MODEL/config.json ]] || { echo "llama_cpp.sh: no bench model at $MODEL (bench/e2e.py makes it)" >&2; exit 1; }
mkdir -p "$WORK"

if [[ ! -d $WORK/src ]]; then
  echo "== llama.cpp source from node-llama-cpp@$NODE_LLAMA_CPP (npm)"
  (cd "$WORK" && npm install --silent --no-save --ignore-scripts "node-llama-cpp@$NODE_LLAMA_CPP")
  git -c advice.detachedHead=false clone -q "$WORK/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$WORK/src"
fi
# llama.cpp's AMX kernels, which -march=native compiles in on a machine with AMX-INT8, abort on
# this model's graph (GGML_ASSERT(*cur_backend_id != -1) in ggml-backend.cpp, llama.cpp v0.5.0 as
# node-llama-cpp 3.22.1 ships it, also with -ot ".*=CPU"): there, the best build without them.
if grep -qw amx_int8 /proc/cpuinfo; then
  ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
       -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
  BUILD_DIR=$WORK/src/build-no-amx
else
  ISA=(-DGGML_NATIVE=ON)
  BUILD_DIR=$WORK/src/build
fi
if [[ ! -x $BUILD_DIR/bin/llama-batched-bench ]]; then
  echo "== building llama-bench and llama-batched-bench (10-20 min on 2 cores): ${ISA[*]}"
  cmake -S "$WORK/src" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ISA[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF > "$WORK/cmake.log"
  cmake --build "$BUILD_DIR" --target llama-bench llama-batched-bench
fi
GGUF=$WORK/bench-3b-q8_0.gguf
if [[ ! -f $GGUF ]]; then
  echo "== converting $MODEL to Q8_0 GGUF"
  /usr/bin/python3 "$ROOT/tools/gguf_from_checkpoint.py" "$MODEL" "$GGUF"
fi
if ((PREPARE)); then
  echo "$BUILD_DIR/bin"
  echo "$GGUF"
  exit 0
fi

echo "== check: llama.cpp's greedy tokens on the default model against tools/reference_forward.py's"
TINY_GGUF=$WORK/tiny-dsv3-q8_0.gguf
[[ -f $TINY_GGUF ]] || /usr/bin/python3 "$ROOT/tools/gguf_from_checkpoint.py" "$ROOT/models/tiny-dsv3" "$TINY_GGUF" > /dev/null
cp "$ROOT/bench/llama_cpp_greedy.mjs" "$WORK/"
/usr/bin/python3 - "$ROOT/models/tiny-dsv3/reference_greedy.json" "$WORK/llama_cpp_greedy.mjs" "$TINY_GGUF" <<'PY'
import json, subprocess, sys
reference, script, gguf = sys.argv[1:]
with open(reference) as f:
    for r in json.load(f):
        ids = ",".join(map(str, r["prompt_ids"]))
        run = subprocess.run(["node", script, gguf, ids, str(len(r["token_ids"]))], capture_output=True, text=True)
        if run.returncode != 0:
            # node-llama-cpp's prebuilt CPU library picks its AMX variant where the CPU has AMX,
            # which aborts as above: the check cannot run on such a machine.
            lines = run.stderr.strip().splitlines() or ["no output"]
            print(f"  not checked: node-llama-cpp failed ({next((l for l in lines if 'ASSERT' in l), lines[-1])})")
            break
        out = run.stdout.splitlines()[-1]
        got, want = json.loads(out), r["token_ids"]
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        print(f"  {r['prompt']!r}: the first {same} of {len(want)} tokens agree "
              f"(reference's smallest top-1/top-2 logit margin {r['min_top1_top2_margin']:.3f})")
PY

BIN=$BUILD_DIR/bin
TAG=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$WORK/node_modules/node-llama-cpp/llama/llama.cpp.info.json")
echo "== llama.cpp $TAG (commit $(git -C "$WORK/src" rev-parse --short HEAD)), as node-llama-cpp@$NODE_LLAMA_CPP ships it"
echo "== llama-bench: pp512 and tg64, $THREADS threads, 3 repetitions"
"$BIN/llama-bench" -m "$GGUF" -t "$THREADS" -p 512 -n 64 -r 3
echo "== llama-batched-bench: 128 prompt + 64 generated tokens per sequence"
"$BIN/llama-batched-bench" -m "$GGUF" -t "$THREADS" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,4,16,32
