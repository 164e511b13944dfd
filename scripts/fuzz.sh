#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ with clang, AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/
# (scripts/sanitizer_build.sh) and runs each in turn for a given time. See Note [Fuzz harnesses] (fuzz/harness.h)
# and docs/RELIABILITY.md.
#
#   scripts/fuzz.sh [--seconds N] [--merge] [HARNESS...]
#     HARNESS      idx_reader, bert_shard, checkpoint, train_flags (default: all four)
#     --seconds N  fuzzing time per harness (default 60)
#     --merge      afterwards, add the new inputs that reach new code, minimised, to the repository's corpus
#                  fuzz/corpus/HARNESS/ (commit them; the replay tests then run them in CI)
#   HETSEQ_BUILD_JOBS   compile jobs (default: number of cores)
#   HETSEQ_FUZZ_FLAGS   more libFuzzer flags, e.g. "-jobs=2 -workers=2" or "-use_value_profile=1"
#
# The repository's corpus is read, never written (but with --merge); new inputs go to the scratch corpus
# build-fuzz/corpus/HARNESS/, kept between runs. A crash, sanitizer report, unexpected exception, timeout (25 s) or
# out-of-memory (4 GB) input is saved as build-fuzz/findings/HARNESS/{crash,timeout,oom,leak}-SHA1; reproduce it
# with `build-fuzz/bin/hetseq-fuzz-HARNESS FILE`, or with the replay program of a normal build,
# `build/bin/hetseq-fuzz-HARNESS FILE`. Each run is appended to build-fuzz/fuzz-runs.tsv (the source of
# docs/RELIABILITY.md's figures): date, harness, seconds run, executions, coverage, scratch corpus size, result.
# Exits 1 when a harness found something.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
all_harnesses=(idx_reader bert_shard checkpoint train_flags)

seconds=60
merge=0
harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "[fuzz] error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [[ ! " ${all_harnesses[*]} " == *" $1 "* ]]; then
        echo "[fuzz] error: unknown harness '$1'; the harnesses are: ${all_harnesses[*]}" >&2
        exit 2
      fi
      harnesses+=("$1"); shift ;;
  esac
done
[ "${#harnesses[@]}" -gt 0 ] || harnesses=("${all_harnesses[@]}")
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "[fuzz] error: --seconds $seconds: expected a positive whole number" >&2
  exit 2
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("hetseq-fuzz-${h//_/-}"); done
bash "$root/scripts/sanitizer_build.sh" "${targets[@]}"

# LibTorch, HDF5 and the other prebuilt libraries are not instrumented; see scripts/sanitize.supp for the leaks of
# theirs that LeakSanitizer is told to ignore. UBSan findings stop the program (-fno-sanitize-recover at compile time).
# allocator_may_return_null=1: HDF5 mallocs what a damaged shard's metadata claims (e.g. 2^63 bytes in H5C_protect),
# and handles the NULL it gets without ASan as an error that hetseq reports naming the file; ASan's default would
# stop the run there instead. hetseq's own allocations use new, which still throws std::bad_alloc (a finding), and
# LibTorch's allocator turns NULL into a c10::Error (a finding too).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/sanitize.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

status=0
summary=()
for h in "${harnesses[@]}"; do
  program="$build/bin/hetseq-fuzz-${h//_/-}"
  scratch="$build/corpus/$h"
  findings="$build/findings/$h"
  log="$build/logs/$h-$(date +%Y%m%d-%H%M%S).log"
  mkdir -p "$scratch" "$findings" "$(dirname "$log")"
  flags=(-max_total_time="$seconds" -print_final_stats=1 -timeout=25 -rss_limit_mb=4096
         -artifact_prefix="$findings/")
  [ "$h" = train_flags ] && flags+=(-dict="$root/fuzz/train_flags.dict")
  echo "[fuzz] $h: $seconds s (log: $log)" >&2
  # shellcheck disable=SC2086  # HETSEQ_FUZZ_FLAGS is a list of flags
  t0=$(date +%s)
  if "$program" "${flags[@]}" ${HETSEQ_FUZZ_FLAGS:-} "$scratch" "$root/fuzz/corpus/$h" >"$log" 2>&1; then
    result=ok
  else
    result="FOUND SOMETHING (see $log and $findings/)"
    status=1
  fi
  elapsed=$(( $(date +%s) - t0 ))  # less than --seconds when a finding stopped the run
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || echo 0)"
  rate="$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || echo 0)"
  coverage="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || echo 0)"
  corpus="$(find "$scratch" -type f | wc -l)"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -Is)" "$h" "$elapsed" "$execs" "$coverage" "$corpus" "$result" \
    >>"$build/fuzz-runs.tsv"
  summary+=("$(printf '%-12s %6s s  %10s executions  %6s/s  coverage %5s  scratch corpus %5s  %s' \
    "$h" "$elapsed" "$execs" "$rate" "$coverage" "$corpus" "$result")")
  if [ "$merge" -eq 1 ] && [ "$result" = ok ]; then
    before="$(find "$root/fuzz/corpus/$h" -type f | wc -l)"
    "$program" -merge=1 -rss_limit_mb=4096 -timeout=25 "$root/fuzz/corpus/$h" "$scratch" >>"$log" 2>&1
    echo "[fuzz] $h: merged $(( $(find "$root/fuzz/corpus/$h" -type f | wc -l) - before )) inputs into fuzz/corpus/$h" >&2
  fi
done

echo "[fuzz] summary (all runs so far: $build/fuzz-runs.tsv)"
for line in "${summary[@]}"; do echo "  $line"; done
exit "$status"
