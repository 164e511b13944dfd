#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures once and builds hetseq into build/. Arguments go to
# `cmake --build`: e.g. --target hetseq-train hetseq-eval builds only those programs.
#   HETSEQ_BUILD_DIR   build directory (default: build)
#   Torch_DIR / CMAKE_PREFIX_PATH   use your own LibTorch instead of the torch wheel
#   HETSEQ_BUILD_JOBS  parallel compile jobs (default: number of cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
jobs="${HETSEQ_BUILD_JOBS:-$(nproc)}"

if [ -n "${Torch_DIR:-}" ] || [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
  SKIP_TORCH_WHEEL=1 bash "$root/scripts/setup.sh"
  prefix="${CMAKE_PREFIX_PATH:-}"
else
  prefix="$(bash "$root/scripts/setup.sh" --print-prefix | tail -n 1)"
fi

if [ ! -f "$build/build.ninja" ]; then
  echo "[build] configuring $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} \
    ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2
    echo "[build] error: CMake configure failed (log above)" >&2
    exit 1
  }
fi
cmake --build "$build" -j "$jobs" "$@"
