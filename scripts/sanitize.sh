#!/usr/bin/env bash
# Builds hetseq, its programs and its test binary with AddressSanitizer and UndefinedBehaviorSanitizer in the
# sanitizer build build-fuzz/ that scripts/fuzz.sh also uses (scripts/sanitizer_build.sh: clang), and runs the tests.
# See docs/RELIABILITY.md (Sanitizers).
#
#   scripts/sanitize.sh [--process-tests] [FILE...]
#     default          the unit tests: every test file of tests/ that starts no process (readers, ranks as threads,
#                      math), one hetseq-tests run per file, then one pass over each fuzz corpus
#     --process-tests  also the test files that start processes (hetseq-train, and the test binary as ranks);
#                      they run under ASan too, and take several times as long as without it
#     FILE...          only these test files, by name without extension (e.g. test_ddp_reducer)
#   HETSEQ_BUILD_JOBS  compile jobs (default: number of cores)
#
# A test file's tests run in one process: a sanitizer report stops it and fails the file; the others still run.
# Logs: build-fuzz/sanitize-logs/FILE.log. Exits 1 when a file failed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

with_processes=0
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --process-tests) with_processes=1; shift ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "[sanitize] error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done

start=$(date +%s)
bash "$root/scripts/sanitizer_build.sh" hetseq-tests hetseq-fuzzers
echo "[sanitize] build: $(( $(date +%s) - start )) s" >&2

# The options, each for a reason (docs/RELIABILITY.md, Sanitizers):
#   detect_leaks=1 + scripts/sanitize.supp  LeakSanitizer on, minus the allocations that LibTorch, Gloo and HDF5
#                                          (not instrumented) keep until exit on purpose; each entry says why
#   allocator_may_return_null=1            HDF5 gets NULL for the absurd sizes a damaged shard claims, as without
#                                          ASan (see scripts/fuzz.sh); hetseq's own new still throws
#   UBSan: print_stacktrace=1              where an undefined behaviour happened (it stops the program: the build
#                                          has -fno-sanitize-recover)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/sanitize.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

# Test files that start processes include the subprocess helper (directly or through support/process_checks.h).
files=()
if [ "${#only[@]}" -gt 0 ]; then
  files=("${only[@]}")
else
  while IFS= read -r path; do
    name="$(basename "$path" .cpp)"
    if grep -qE '"support/(subprocess|process_checks).h"' "$path" && [ "$with_processes" -eq 0 ]; then continue; fi
    files+=("$name")
  done < <(find "$root/tests" -name 'test_*.cpp' | sort)
fi

logs="$build/sanitize-logs"
mkdir -p "$logs"
failed=()
report=()
run() {  # NAME COMMAND...: runs a command with its log, records its time and result
  local name="$1"; shift
  local t0=$(date +%s) result=ok
  "$@" >"$logs/$name.log" 2>&1 || { result=FAILED; failed+=("$name"); }
  report+=("$(printf '%-32s %5s s  %s' "$name" "$(( $(date +%s) - t0 ))" "$result")")
  echo "[sanitize] $name: $result ($(( $(date +%s) - t0 )) s)" >&2
}
for f in "${files[@]}"; do
  # -#: Catch2 tags each test with its file name, so that one run takes one file. Hidden tests ([.]) are left out
  # (an explicit tag would select them): they need what their own ctest script sets up; the BERT reference check's
  # script runs below.
  if [ -z "$("$build/bin/hetseq-tests" -# --list-test-names-only "[#$f]~[.]" 2>/dev/null | grep -v '^$' || true)" ]; then
    echo "[sanitize] $f: no tests to run (hidden tests only)" >&2
    continue
  fi
  run "$f" "$build/bin/hetseq-tests" -# "[#$f]~[.]"
done
if [ "${#only[@]}" -eq 0 ]; then
  # The hidden BERT reference test, as ctest runs it (transformers writes the reference, then the sanitized binary
  # compares).
  run "bert_reference_vs_transformers" bash "$root/scripts/bert_reference_check.sh" "$build/bin/hetseq-tests"
  for h in idx_reader bert_shard checkpoint train_flags; do
    # -runs=0: libFuzzer runs the corpus once and stops.
    run "fuzz_corpus_$h" "$build/bin/hetseq-fuzz-${h//_/-}" -runs=0 "$root/fuzz/corpus/$h"
    # The replay as CI runs it, sanitized: valid-* accepted, the known bad inputs rejected for their reason.
    run "fuzz_replay_$h" "$build/bin/hetseq-fuzz-${h//_/-}-replay" --expect "$root/fuzz/expected/$h.tsv" \
      "$root/fuzz/corpus/$h"
  done
fi

echo "[sanitize] $(( $(date +%s) - start )) s in all; per run:"
for line in "${report[@]}"; do echo "  $line"; done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "[sanitize] FAILED: ${failed[*]} (logs in $logs/)" >&2
  exit 1
fi
echo "[sanitize] clean"
