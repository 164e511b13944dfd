#!/usr/bin/env bash
# hetseq from Python in one command: installs what is missing (scripts/setup.sh: the compilers, CMake, torch and
# scikit-build-core in the project's environment), builds the Python package (the extension hetseq._C and
# libhetseq, against that torch) and installs it into that environment with
#   pip install --no-build-isolation --no-deps .
# (pyproject.toml), so that `import hetseq` works there without PYTHONPATH. Then it imports hetseq from a folder
# away from the checkout, and prints the Python to use on its last line:
#   py="$(bash scripts/install_python.sh | tail -n 1)"
#   "$(dirname "$py")/torchrun" --nproc-per-node 2 examples/python/mnist.py --batch-sizes 24,40
# The first build compiles libhetseq (minutes); its folder stays (build/pip/<wheel tag>, or $SKBUILD_BUILD_DIR),
# so a run after a change rebuilds what changed. Run it again after pulling: the installed package is a copy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "[install_python] $*" >&2; }

bash "$root/scripts/setup.sh" >&2
py="$(bash "$root/scripts/setup.sh" --print-python | tail -n 1)"
[ -x "$py" ] || { log "error: scripts/setup.sh named no Python ('$py')"; exit 1; }

log "building and installing hetseq into $("$py" -c 'import sys; print(sys.prefix)') (the first time takes minutes)"
start=$(date +%s)
(cd "$root" && "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .) || {
  log "error: pip install --no-build-isolation --no-deps . failed in $root (its output is above)"
  exit 1
}
log "installed in $(( $(date +%s) - start )) s"

# The installed package, not the checkout: from an empty folder, without PYTHONPATH.
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
(cd "$check" && env -u PYTHONPATH "$py" -c '
import os, hetseq, torch
print(f"[install_python] import hetseq works: hetseq {hetseq.__version__} from {os.path.dirname(hetseq.__file__)}, "
      f"torch {torch.__version__}")' >&2) || {
  log "error: the installed hetseq does not import with $py (the message is above)"
  exit 1
}
echo "$py"
