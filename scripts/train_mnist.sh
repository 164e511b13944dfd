#!/usr/bin/env bash
# The main job: builds if needed, then trains the MNIST task (HetSeq's MNISTNet) on Fashion-MNIST for
# one epoch and prints the test accuracy. Extra arguments go to hetseq-train
# (e.g. --max-epoch 5, --max-sentences 128).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
bash "$root/scripts/build.sh" --target hetseq-train hetseq-eval >/dev/null

"$build/bin/hetseq-train" --task mnist --data /usr/share/datasets/fashion-mnist --cpu \
  --max-sentences 64 --optimizer adam --lr 0.001 --max-epoch 1 --valid-subset test \
  --save-dir "$root/checkpoints/mnist" "$@"

"$build/bin/hetseq-eval" --task mnist --data /usr/share/datasets/fashion-mnist --cpu \
  --path "$root/checkpoints/mnist/checkpoint_last.pt" --valid-subset test --log-format json |
  python3 -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(f"test accuracy: {r[\"accuracy\"]:.2f}% (loss {r[\"loss\"]:.3f} bits)")'
