#!/usr/bin/env bash
# The main job: builds if needed, then trains the MNIST task (HetSeq's MNISTNet) on Fashion-MNIST for
# one epoch, prints the test accuracy and says where the run's plots (scripts/plot_run.py over its
# --json-log) and its timeline (--trace-dir, updates 101 to 120) are. Extra arguments go to hetseq-train
# (e.g. --max-epoch 5, --max-sentences 128). Each run trains from scratch: it clears its own
# checkpoints/mnist first (hetseq-train would otherwise resume from checkpoint_last.pt there; README,
# "Checkpoints", shows how to stop and continue a run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
bash "$root/scripts/build.sh" --target hetseq-train hetseq-eval hetseq-trace >/dev/null

# With no GPU: 2 CPU workers over Gloo on this machine, 32 samples each (64 per update, as one
# process with batch 64). With GPUs: one worker per visible device.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  workers=(--max-sentences 64)
else
  workers=(--cpu --distributed-world-size 2 --distributed-gpus 2 --max-sentences 32)
fi
save_dir="$root/checkpoints/mnist"
rm -rf "$save_dir"/checkpoint*.pt "$save_dir/train_log.jsonl" "$save_dir/trace" "$save_dir/plots"
"$build/bin/hetseq-train" --task mnist --data /usr/share/datasets/fashion-mnist "${workers[@]}" \
  --distributed-init-method tcp://127.0.0.1:0 --optimizer adam --lr 0.001 --max-epoch 1 \
  --valid-subset test --save-dir "$save_dir" --json-log "$save_dir/train_log.jsonl" \
  --trace-dir "$save_dir/trace" --trace-updates 101:120 "$@"

"$build/bin/hetseq-eval" --task mnist --data /usr/share/datasets/fashion-mnist --cpu \
  --path "$save_dir/checkpoint_last.pt" --valid-subset test --log-format json |
  python3 -c 'import json, sys; r = json.loads(sys.stdin.read().strip().splitlines()[-1]); print("test accuracy: %.2f%% (loss %.3f bits)" % (r["accuracy"], r["loss"]))'

# What the run looked like: plots of its JSON log, and the ranks' timelines merged into one trace.
python="$(bash "$root/scripts/setup.sh" --print-python | tail -n 1)"
"$python" "$root/scripts/plot_run.py" "$save_dir/train_log.jsonl" -o "$save_dir/plots" >/dev/null
"$build/bin/hetseq-trace" merge "$save_dir/trace" >/dev/null
echo "plots: $save_dir/plots/ (loss, lr, throughput, ranks, split .png)"
if "$python" "$root/scripts/plot_trace.py" "$save_dir/trace/trace.json" >/dev/null 2>&1; then
  echo "trace: $save_dir/trace/trace.json (open in https://ui.perfetto.dev or chrome://tracing; three updates drawn in trace.png)"
else
  echo "trace: $save_dir/trace/ holds no update (the run ended before update 101, where its window starts)"
fi
