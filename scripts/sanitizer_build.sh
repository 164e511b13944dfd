#!/usr/bin/env bash
# The sanitizer build that scripts/fuzz.sh and scripts/sanitize.sh share, build-fuzz/: clang, AddressSanitizer and
# UndefinedBehaviorSanitizer on every hetseq target (-DHETSEQ_FUZZ=ON, see cmake/sanitizers.cmake), with libFuzzer's
# coverage instrumentation, which costs the tests little. One build rather than two because on a 2-core machine
# compiling the LibTorch-heavy library with sanitizers takes about an hour, and the two could not share objects
# through ccache (their precompiled headers would differ).
#
#   scripts/sanitizer_build.sh TARGET...    configures build-fuzz/ if needed, then builds the targets
#   HETSEQ_BUILD_JOBS  compile jobs (default: number of cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="${HETSEQ_BUILD_JOBS:-$(nproc)}"
if ! command -v clang++ >/dev/null; then
  # Debian's clang brings libFuzzer and the sanitizer runtimes (compiler-rt) with it.
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "[sanitizer-build] installing Debian's clang" >&2
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null; } ||
    { echo "[sanitizer-build] error: clang++ not found and apt-get could not install Debian's clang" >&2; exit 1; }
fi

if [ ! -f "$build/build.ninja" ]; then
  prefix="$(bash "$root/scripts/setup.sh" --print-prefix | tail -n 1)"
  echo "[sanitizer-build] configuring $build (clang, ASan + UBSan, libFuzzer coverage)" >&2
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETSEQ_FUZZ=ON \
    -DHETSEQ_BUILD_TESTS=ON -DHETSEQ_BUILD_BENCHMARKS=OFF -DCMAKE_PREFIX_PATH="$prefix" \
    >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    echo "[sanitizer-build] error: CMake configure failed (log above)" >&2
    exit 1
  }
fi
if grep -q '^HETSEQ_BUILD_TESTS:BOOL=OFF' "$build/CMakeCache.txt"; then
  # A build-fuzz/ configured for the fuzzers only (an older scripts/fuzz.sh) gains the test binary.
  cmake "$build" -DHETSEQ_BUILD_TESTS=ON >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    echo "[sanitizer-build] error: CMake could not add the tests to $build (log above)" >&2
    exit 1
  }
fi
cmake --build "$build" -j "$jobs" --target "$@"
