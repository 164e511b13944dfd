#!/usr/bin/env bash
# Checks the Python package's pip path (pyproject.toml, scikit-build-core): `pip install --no-build-isolation .`
# with the venv's Python builds hetseq._C and libhetseq against the venv's torch and installs the package, here
# into a throwaway folder (--target; --no-deps: torch is the venv's already). Then, from a folder away from
# the checkout, it imports hetseq from there (not from build/python) and uses it: a data plan, and a checkpoint
# written and read back by the installed library. Slow the first time (it builds libhetseq: minutes), then
# incremental (the build folder stays, build/pip). Not part of the test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/setup.sh" --print-python | tail -n 1)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "[pip] pip install --no-build-isolation --no-deps --target $out/site $root" >&2
start=$(date +%s)
(cd "$root" && "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
   --target "$out/site" .)
echo "[pip] installed in $(( $(date +%s) - start )) s: $(cd "$out/site" && ls -d hetseq* | tr '\n' ' ')" >&2
cd "$out"
PYTHONPATH="$out/site" "$py" - "$out/site" <<'PYEOF'
import os
import sys

import torch

import hetseq

site = sys.argv[1]
assert os.path.realpath(hetseq.__file__).startswith(os.path.realpath(site)), hetseq.__file__
plan = hetseq.data.Plan(100, [3, 7], seed=1)
seen = sorted(i for r in range(2) for u in plan.updates(r) for mb in u for i in mb)
assert seen == list(range(100)), seen
c = hetseq._C.Checkpoint()
c.model = [("w", torch.arange(4.0))]
hetseq._C.save_checkpoint(c, "c.pt")
assert torch.equal(hetseq._C.load_checkpoint("c.pt").model[0][1], torch.arange(4.0))
print(f"[pip] ok: hetseq {hetseq.__version__} from {os.path.dirname(hetseq.__file__)}, built against torch "
      f"{hetseq._C.torch_version}, running torch {torch.__version__}")
PYEOF
