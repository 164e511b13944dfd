#!/usr/bin/env bash
# The main job: builds if needed, then trains the MNIST task (HetSeq's MNISTNet) on Fashion-MNIST for
# one epoch and prints the test accuracy. Extra arguments go to hetseq-train
# (e.g. --max-epoch 5, --max-sentences 128). Each run trains from scratch: it clears its own
# checkpoints/mnist first (hetseq-train would otherwise resume from checkpoint_last.pt there; README,
# "Checkpoints", shows how to stop and continue a run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
bash "$root/scripts/build.sh" --target hetseq-train hetseq-eval >/dev/null

# With no GPU: 2 CPU workers over Gloo on this machine, 32 samples each (64 per update, as one
# process with batch 64). With GPUs: one worker per visible device.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  workers=(--max-sentences 64)
else
  workers=(--cpu --distributed-world-size 2 --distributed-gpus 2 --max-sentences 32)
fi
save_dir="$root/checkpoints/mnist"
rm -f "$save_dir"/checkpoint*.pt
"$build/bin/hetseq-train" --task mnist --data /usr/share/datasets/fashion-mnist "${workers[@]}" \
  --distributed-init-method tcp://127.0.0.1:0 --optimizer adam --lr 0.001 --max-epoch 1 \
  --valid-subset test --save-dir "$save_dir" "$@"

"$build/bin/hetseq-eval" --task mnist --data /usr/share/datasets/fashion-mnist --cpu \
  --path "$save_dir/checkpoint_last.pt" --valid-subset test --log-format json |
  python3 -c 'import json, sys; r = json.loads(sys.stdin.read().strip().splitlines()[-1]); print("test accuracy: %.2f%% (loss %.3f bits)" % (r["accuracy"], r["loss"]))'
