#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang in build-fuzz/ and runs it for a bounded time
# from a small seed corpus. Exits non-zero when the fuzzer finds a crash (saved under
# build-fuzz/fuzz-artifacts/).
#   usage: scripts/fuzz.sh [seconds]        (default 60; JOBS=N sets build parallelism, default 2)
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$build" -j "${JOBS:-2}" safetensors_header_fuzz

# Each input is an 8-byte little-endian data-section size followed by the JSON header.
corpus="$build/fuzz-corpus/safetensors_header"
mkdir -p "$corpus" "$build/fuzz-artifacts"
seed() { printf '%b%s' "$2" "$3" > "$corpus/$1"; }
size16='\x10\0\0\0\0\0\0\0'
seed valid "$size16" '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}'
seed fp8 '\x14\0\0\0\0\0\0\0' '{"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]},"w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[16,20]}}'
seed ints "$size16" '{"i":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"j":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},"h":{"dtype":"F16","shape":[4],"data_offsets":[8,16]}}'
seed overlap "$size16" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
seed empty '\0\0\0\0\0\0\0\0' '{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}'

dict="$build/fuzz-corpus/safetensors_header.dict"
cat > "$dict" <<'EOF'
"__metadata__"
"dtype"
"shape"
"data_offsets"
"F32"
"BF16"
"F16"
"F8_E4M3"
"I8"
"I32"
"F64"
"18446744073709551615"
"9223372036854775807"
EOF

"$build/tests/fuzz/safetensors_header_fuzz" -max_total_time="$seconds" -dict="$dict" \
  -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1 "$corpus"
