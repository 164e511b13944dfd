#!/usr/bin/env bash
# The installed package, as a user of hetseq meets it (ctest install_custom_task):
#   1. cmake --install BUILD into a temporary prefix: the public headers and no internal one, libhetseq,
#      the programs, hetseqConfig.cmake and its version file;
#   2. examples/custom_task configured and built from a clean build directory against that prefix alone
#      (find_package(hetseq 0.2)), as a task library and as a program of its own;
#   3. the installed hetseq-train with --user-dir shows the task's flags under --task spirals --help;
#   4. both ways train the spirals task for 4 epochs on 2 CPU ranks over file://, with a typed task flag
#      (--hidden, an int64_t, compared across the ranks): each exits 0, validates every epoch with the
#      loss the task never logged itself, learns (below 0.7 bits, above 70%), and the two runs give the
#      same validation lines to the last printed digit.
#   check_install.sh BUILD_DIR
set -euo pipefail
build="$(cd "${1:?usage: check_install.sh BUILD_DIR}" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/hetseq-install.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }
show() { echo "--- $1"; tail -n 40 "$1"; }

prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { show "$tmp/install.log"; fail "cmake --install"; }
for f in include/hetseq/hetseq.h include/hetseq/version.h include/hetseq/task/model_task.h \
         lib/cmake/hetseq/hetseqConfig.cmake lib/cmake/hetseq/hetseqConfigVersion.cmake bin/hetseq-train bin/hetseq-eval; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
ls "$prefix"/lib/libhetseq.so* >/dev/null 2>&1 || fail "libhetseq.so is not installed"
for f in cli/train_options.h train/controller.h reduce/ddp_reducer.h checkpoint/checkpoint.h \
         world/world.h session/train_session.h; do
  [ ! -e "$prefix/include/hetseq/$f" ] || fail "the internal header hetseq/$f is installed"
done
[ -e "$prefix/include/hetseq/session/train.h" ] || fail "hetseq/session/train.h (hetseq::train) is not installed"
if grep -rlE '#include [<"](torch/csrc/distributed|cxxopts)' "$prefix/include/hetseq"; then
  fail "an installed header includes c10d or cxxopts"
fi
echo "check_install: installed into $prefix ($(find "$prefix/include" -name '*.h' | wc -l) public headers)"

torch_dir="$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")"
[ -n "$torch_dir" ] || fail "$build/CMakeCache.txt names no Torch_DIR"
example="$tmp/example"
# Through ccache where there is one, with paths under $tmp made relative, so that a rerun of the suite
# does not compile the example (about 20 s) again.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$tmp" CCACHE_NOHASHDIR=1
fi
cmake -S "$root/examples/custom_task" -B "$example" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$torch_dir" >"$tmp/configure.log" 2>&1 ||
  { show "$tmp/configure.log"; fail "configuring examples/custom_task against the installed hetseq"; }
cmake --build "$example" -j "${HETSEQ_BUILD_JOBS:-2}" >"$tmp/build.log" 2>&1 ||
  { show "$tmp/build.log"; fail "building examples/custom_task against the installed hetseq"; }
# Any include flag (-I, -isystem, -iquote, -idirafter, with or without a space) into the source or the build
# tree: the installed prefix alone must serve the example.
if grep -nE -- "-(I|isystem|iquote|idirafter) ?($root|$build)(/| |$)" "$example/build.ninja" >"$tmp/leaks.txt"; then
  cat "$tmp/leaks.txt" >&2
  fail "the example was compiled with headers of the source tree ($root) or the build tree ($build)"
fi
echo "check_install: built $example/libspirals_task.so and $example/spirals-train"

plugin=("$prefix/bin/hetseq-train" --user-dir "$example/libspirals_task.so")
"${plugin[@]}" --task spirals --help >"$tmp/help.txt" 2>&1 || { show "$tmp/help.txt"; fail "--task spirals --help"; }
grep -q -- "--hidden N" "$tmp/help.txt" || { show "$tmp/help.txt"; fail "--help does not show the task's --hidden"; }
grep -q "spirals task" "$tmp/help.txt" || fail "--help does not show the spirals task's flag group"

# Trains one way; $1 names the run, the rest is the program.
train() {
  local name="$1"; shift
  mkdir -p "$tmp/$name"
  timeout -k 10 300 "$@" --task spirals --hidden 16 --cpu --distributed-world-size 2 --distributed-gpus 2 \
    --distributed-init-method "file://$tmp/$name/rendezvous" --max-sentences 25 --max-epoch 4 --log-interval 10 \
    --save-dir "$tmp/$name/checkpoints" --seed 3 >"$tmp/$name/log" 2>&1 ||
    { show "$tmp/$name/log"; fail "$name: the 2-rank run exited with $?"; }
  grep -q "over 2 rank(s)" "$tmp/$name/log" || { show "$tmp/$name/log"; fail "$name: not a 2-rank run"; }
  [ -f "$tmp/$name/checkpoints/checkpoint_last.pt" ] || fail "$name: no checkpoint_last.pt"
  grep "| valid on 'valid' subset" "$tmp/$name/log" | sed 's/.*| valid on/valid on/; s/| wall [^|]*//' >"$tmp/$name/valid"
  [ "$(wc -l <"$tmp/$name/valid")" -eq 4 ] || { show "$tmp/$name/log"; fail "$name: not one validation per epoch"; }
  python3 - "$tmp/$name/valid" "$name" <<'PYEOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
loss = [float(re.search(r"\| loss ([0-9.]+)", l).group(1)) for l in lines]
acc = [float(re.search(r"\| accuracy ([0-9.]+)", l).group(1)) for l in lines]
# An untrained model scores about 1 bit and 50%; these runs reach about 0.45 bits and 80%.
if not (0 < loss[-1] < 0.7 and acc[-1] > 70):
    sys.exit(f"check_install: FAIL: {sys.argv[2]}: the task did not learn: loss {loss}, accuracy {acc}")
print(f"check_install: {sys.argv[2]}: validation loss {loss}, accuracy {acc}")
PYEOF
}
train plugin "${plugin[@]}"
train program "$example/spirals-train"
cmp -s "$tmp/plugin/valid" "$tmp/program/valid" ||
  { diff "$tmp/plugin/valid" "$tmp/program/valid" || true; fail "the plugin and the program trained different models"; }
echo "check_install: PASS"
