#!/usr/bin/env bash
# Python hetseq against torch's DDP on the same torch wheel: MNIST's net from a Python loop, 2 and 3 ranks of
# this machine under torchrun, the two systems alternating, REPEATS times; prints each run's JSON line and the
# median ratio of seconds per update (torch / hetseq: above 1, hetseq is faster).
#   bash benchmarks/python_ddp.sh [REPEATS]   (after scripts/build.sh: hetseq._C in build/python)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
repeats="${1:-3}"
py="$(bash "$root/scripts/setup.sh" --print-python | tail -n 1)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for r in $(seq "$repeats"); do
  for case in "2 64,64" "3 64,64,64"; do
    set -- $case
    for system in hetseq torch; do
      PYTHONPATH="$build/python" OMP_NUM_THREADS=1 timeout 300 "$py" -m torch.distributed.run --standalone \
        --nproc-per-node "$1" "$root/benchmarks/python_ddp_worker.py" --system "$system" --batch-sizes "$2" \
        2>/dev/null | grep '^{' | tee -a "$out"
    done
  done
done
"$py" - "$out" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for ranks in sorted({r["ranks"] for r in rows}):
    h = [r["s_per_update"] for r in rows if r["ranks"] == ranks and r["system"] == "hetseq"]
    t = [r["s_per_update"] for r in rows if r["ranks"] == ranks and r["system"] == "torch"]
    ratios = [b / a for a, b in zip(h, t)]
    leave = statistics.median(r["leave_update_s"] for r in rows if r["ranks"] == ranks and r["system"] == "hetseq")
    print(f"{ranks} ranks: hetseq {statistics.median(h) * 1e3:.1f} ms/update, torch DDP {statistics.median(t) * 1e3:.1f}"
          f" ms/update, torch/hetseq {statistics.median(ratios):.3f} (median of {len(ratios)}), leaving hetseq's "
          f"update {leave * 1e3:.2f} ms")
PYEOF
