#!/usr/bin/env bash
# CI (aarch64): cross-build the library and the projection tests for AArch64 and run them under
# qemu-user. Runs when CI_AARCH64=1, or when the cross tools are already installed; otherwise it
# says so and exits 0. With CI_AARCH64=1 it installs what is missing (Debian 12):
#   gcc-aarch64-linux-gnu qemu-user-static
# Usage: .ci/aarch64.sh [build-dir (default build-aarch64)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-aarch64}
have() { command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64-static >/dev/null 2>&1; }
if ! have; then
  if [ "${CI_AARCH64:-0}" != 1 ]; then
    echo "aarch64: cross tools not installed and CI_AARCH64 != 1: skipped"
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user-static cmake make >/dev/null
fi
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64.cmake" -DCMAKE_BUILD_TYPE=Release >/dev/null
# the library and the projection tests (test_proj once the service lands)
targets=(nightlora test_host)
[ -f tests/test_proj.c ] && targets+=(test_proj)
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${targets[@]}"
regex=$(IFS='|'; echo "^(${targets[*]:1})\$")
cd "$BUILD" && ctest --output-on-failure -R "$regex"
