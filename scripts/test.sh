#!/usr/bin/env bash
# The whole test suite: builds if needed, then runs every test with ctest (each test with a deadline).
# After the run it lists the checks that did not run in full on this machine (the tests' Catch2 WARN
# lines, e.g. the CUDA tests without a GPU), since ctest shows the output of passing tests nowhere else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
bash "$root/scripts/build.sh"
cd "$build"
code=0
# One test more than the cores: a third of the suite's time is waiting (rendezvous timeouts, killed peers, Slurm
# and torchrun agents, checkpoint fences), which a third test fills; tests tagged [serial] still run alone.
ctest --output-on-failure --timeout 600 -j "${HETSEQ_TEST_JOBS:-$(( $(nproc) + 1 ))}" "$@" || code=$?
log="$build/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  # Catch2 prints "FILE:LINE: warning:" (or "warning:" on a line of its own), then the message indented
  # by two spaces over one or more lines, then a blank line.
  partial="$(awk 'function flush() { if (msg != "") print msg; msg = ""; w = 0 }
                  /(^|: )warning:$/ {flush(); w = 1; next}
                  w && /^  [^ ]/ {sub(/^  /, ""); msg = msg (msg == "" ? "" : " ") $0; next}
                  {flush()} END {flush()}' "$log" | sort | uniq -c | sort -rn)"
  if [ -n "$partial" ]; then
    echo "[test] not run in full here (the tests' WARN lines, with how often each was printed):"
    echo "$partial"
  fi
fi
# The Python extension's tests (tests/python) with the venv's pytest against the built package (build/python):
# pytest's "no tests ran" (exit 5) fails the suite too.
python="$(sed -n 's/^HETSEQ_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")"
if grep -q '^HETSEQ_PYTHON_EXTENSION:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "[test] pytest tests/python (hetseq._C from $build/python)"
  (cd "$build" && PYTHONPATH="$build/python" OMP_NUM_THREADS=1 \
     timeout 900 "$python" -m pytest -q -p no:cacheprovider "$root/tests/python") || code=$?
else
  echo "[test] error: the Python extension was not built (HETSEQ_PYTHON_EXTENSION is off in $build): its tests did not run" >&2
  code=1
fi
exit "$code"
