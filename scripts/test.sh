#!/usr/bin/env bash
# The whole test suite: builds if needed, then runs every test with ctest (each test with a deadline).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
bash "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --timeout 600 -j "${HETSEQ_TEST_JOBS:-2}" "$@"
