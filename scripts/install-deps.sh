#!/usr/bin/env bash
# Installs every Debian package moe-serve's build, tests and tools need. Idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang libclang-rt-14-dev
  libdnnl-dev libopenmpi-dev openmpi-bin libzmq3-dev cppzmq-dev libcpp-httplib-dev
  nlohmann-json3-dev libpcre2-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-torch python3-regex
  curl
)
# The machine image may ship its own Node.js; Debian's would conflict with it.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
