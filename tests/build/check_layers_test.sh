#!/usr/bin/env bash
# The module layering check that the build runs (cmake/check_layers.cmake), on a small tree of its own
# (ctest module_layering_check): an include of a module below passes; an include of a module above, or
# of the public umbrella, fails naming the file and the header.
#   check_layers_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "${1:?usage: check_layers_test.sh SOURCE_DIR}" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/hetseq-layers.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_layers_test: FAIL: $*" >&2; exit 1; }
check() {  # check MODULE ALLOWED -> output in $tmp/out, status returned
  cmake -DROOT="$tmp/tree" -DMODULE="$1" -DALLOWED="$2" -DORDER=core,data,train -DSTAMP="$tmp/stamp" \
    -P "$src/cmake/check_layers.cmake" >"$tmp/raw" 2>&1 && status=0 || status=$?
  tr -s ' \n' ' ' <"$tmp/raw" >"$tmp/out"  # CMake wraps long messages
  return "$status"
}
mkdir -p "$tmp/tree/hetseq/core" "$tmp/tree/hetseq/data" "$tmp/tree/hetseq/train"
printf '#include "hetseq/core/error.h"\n#include "hetseq/version.h"\n' >"$tmp/tree/hetseq/data/plan.cpp"
printf '#include "hetseq/data/plan.h"\n#include <hetseq/core/format.h>\n' >"$tmp/tree/hetseq/train/loop.cpp"
check data core || { cat "$tmp/raw"; fail "an include of core (and version.h) from data was refused"; }
[ -f "$tmp/stamp" ] || fail "a clean module leaves no stamp"
check train core,data || { cat "$tmp/raw"; fail "includes of lower modules from train were refused"; }
rm -f "$tmp/stamp"
printf '#include "hetseq/train/loop.h"\n' >"$tmp/tree/hetseq/data/bad.h"
if check data core; then fail "data including train passed"; fi
grep -q "hetseq/data/bad.h includes hetseq/train/loop.h (module train)" "$tmp/out" || { cat "$tmp/raw"; fail "wrong message"; }
grep -q "'data' may include only core" "$tmp/out" || { cat "$tmp/raw"; fail "the message does not say what data may include"; }
[ ! -f "$tmp/stamp" ] || fail "a failed check left its stamp"
rm "$tmp/tree/hetseq/data/bad.h"
printf '#include <hetseq/hetseq.h>\n' >"$tmp/tree/hetseq/core/umbrella.cpp"
if check core ""; then fail "core including the public umbrella passed"; fi
grep -q "includes hetseq/hetseq.h (module (the public umbrella))" "$tmp/out" || { cat "$tmp/raw"; fail "wrong message"; }
grep -q "'core' may include no other module" "$tmp/out" || { cat "$tmp/raw"; fail "wrong message for core"; }
echo "check_layers_test: PASS"
