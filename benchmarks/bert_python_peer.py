#!/usr/bin/env python3
"""A strong PyTorch (Python API) peer of `hetseq-train --task bert`, for throughput and MFU comparisons.

Pretrains the same BERT (a bert_config.json, e.g. configs/bert-tiny.json) on the same HDF5 shards as hetseq
(tasks/bert/), in plain PyTorch from the same wheel, written as a PyTorch user after speed would write it.

The same as hetseq: post-LayerNorm BERT (word/position/token-type embeddings, SDPA attention, exact GELU,
pooler, MLM head at the masked positions only with the decoder tied to the word embeddings, NSP head), BERT's
initialisation (normal 0.02, zero biases), the loss of Note [BERT loss and sample size] (per-sequence mean MLM
cross-entropy plus NSP, summed; the gradient is that of the mean over the update's sequences), AdamW (constant
--lr, --weight-decay, gradient clipping with --clip-norm), HetSeq's labels (the masked positions are those before the first 0 of
masked_lm_positions). Batches as in Note [Data plan]: a permutation of the train split by
np.random.RandomState(--seed) (seed + e for a further epoch e), consecutive chunks of batch-size x workers (a
short last chunk is dropped), rank r taking its slice, sorted. --workers 2: DistributedDataParallel over Gloo
on 127.0.0.1 (CPU only); --device cuda: GPU 0, one worker.

Faster than the obvious: AdamW(fused=True) (an error where refused, no fallback); Q, K, V in one product; a
DataLoader of --loader-workers processes (pinned on CUDA, --prefetch-factor batches each) that read a batch's rows
with one sorted read per shard and field, and find the masked positions, targets and sequences on the CPU, so
an update has no nonzero, .item() or other host sync; no attention mask for a batch without padding (flash
attention may run); --precision bf16/fp16 under autocast (fp16 with a GradScaler, stepped without a sync).
--compile: the model and its loss under torch.compile (compiled in the warm-up), the masked positions padded
to batch x max_predictions with ignored targets so shapes are static; the attention mask is then always passed
with shards (real shards nearly always have padding) and never with --synthetic (one graph either way).

Measured: --warmup updates, then --updates timed (CUDA events between synchronizations on CUDA, perf_counter
on the CPU), then one untimed update that counts its ATen operators under the profiler (forward, backward,
optimizer and the batch's copy; nested ones included) and, on CUDA, its host syncs. One JSON line on stdout:
sequences_per_s (all workers), FLOPs per sequence by benchmarks/bert_flops.py (model_flops_per_sequence at
the mean real masked count, flops_6nt_per_sequence), mfu_model and mfu_6nt (null where the device's peak is
unknown, as on the CPU), medians per timed update of data_wait_ms (blocked on the loader plus issuing the
copy), host_ms and device_ms (CUDA events; host_ms on the CPU), peak_memory_bytes (CUDA max allocated, else
the maximum RSS), final_loss (the last timed update's loss per sequence in bits, base 2 as hetseq logs it).

--synthetic N: random batches of the shards' shapes (128 tokens, no padding, 20 masked positions), no h5py.
"""
import argparse
import glob
import json
import math
import os
import resource
import socket
import statistics
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bert_flops  # noqa: E402  (beside this file)

IGNORE = -100  # cross_entropy's ignore_index: the target of a padding masked position
FIELDS = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.p_attn = c["attention_probs_dropout_prob"]
        self.qkv = nn.Linear(h, 3 * h)  # query, key and value in one product
        self.attn_out, self.attn_norm = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.inter, self.out = nn.Linear(h, c["intermediate_size"]), nn.Linear(c["intermediate_size"], h)
        self.out_norm = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, x, attend):
        b, s, h = x.shape
        # [3, b, heads, s, head_dim]: the last dimension stays contiguous, as the fused kernels need.
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attend,
                                             dropout_p=self.p_attn if self.training else 0.0)
        a = self.attn_norm(self.drop(self.attn_out(ctx.transpose(1, 2).reshape(b, s, h))) + x)
        return self.out_norm(self.drop(self.out(F.gelu(self.inter(a)))) + a)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.words = nn.Embedding(c["vocab_size"], h)
        self.positions = nn.Embedding(c["max_position_embeddings"], h)
        self.types = nn.Embedding(c["type_vocab_size"], h)
        self.emb_norm, self.emb_drop = nn.LayerNorm(h, eps=1e-12), nn.Dropout(c["hidden_dropout_prob"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.pooler = nn.Linear(h, h)
        self.transform, self.transform_norm = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(c["vocab_size"]))
        self.nsp = nn.Linear(h, 2)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.data.normal_(0.0, c["initializer_range"])
            if isinstance(m, nn.Linear):
                m.bias.data.zero_()

    def forward(self, ids, types, attend, masked_index):
        """ids, types [b, S]; attend: None (no padding) or bool [b, 1, 1, S], True = may attend; masked_index [M]:
        flat positions b * S + s. Returns the MLM logits [M, vocab] and the NSP logits [b, 2]."""
        s = ids.shape[1]
        # The position embedding of 0..S-1 is the table's first S rows: a slice, not a lookup.
        x = self.words(ids) + self.positions.weight[:s] + self.types(types)
        x = self.emb_drop(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x, attend)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        sel = x.reshape(-1, x.shape[-1]).index_select(0, masked_index)
        t = self.transform_norm(F.gelu(self.transform(sel)))
        return F.linear(t, self.words.weight, self.decoder_bias), self.nsp(pooled)


class PreTrainingLoss(nn.Module):
    """BertForPreTraining with its loss: forward returns sum_i L_i of Note [BERT loss and sample size]
    (tasks/bert/bert_task.h), from the masked positions, targets and sequences that the collate found."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, ids, types, attend, masked_index, masked_targets, masked_sequence, inverse_count, nsp_labels):
        mlm_logits, nsp_logits = self.bert(ids, types, attend, masked_index)
        # float32 logits whatever the autocast dtype, as hetseq; padding positions (IGNORE) give 0.
        token = F.cross_entropy(mlm_logits.float(), masked_targets, reduction="none", ignore_index=IGNORE)  # [M]
        per_sequence = torch.zeros_like(inverse_count).index_add_(0, masked_sequence, token)  # [b]
        mlm = (per_sequence * inverse_count).sum()
        return mlm + F.cross_entropy(nsp_logits.float(), nsp_labels, reduction="sum")


class Shards(torch.utils.data.Dataset):
    """The rows of the *train* HDF5 shards. __getitems__ (what a DataLoader with a batch sampler calls) reads a
    batch: per shard, one fancy-index read of its sorted rows per field. Each process opens its own h5py handles
    on first use (handles do not survive a fork)."""

    def __init__(self, files):
        import h5py  # only here: --synthetic runs without it

        if not files:
            raise SystemExit("bert_python_peer.py: error: no *train* shards under --data")
        self.files, sizes, shapes = files, [], set()
        for name in files:
            with h5py.File(name, "r") as f:
                sizes.append(f["input_ids"].shape[0])
                shapes.add((f["input_ids"].shape[1], f["masked_lm_positions"].shape[1]))
        if len(shapes) != 1:
            raise SystemExit(f"bert_python_peer.py: error: the shards disagree on (seq_length, max_predictions): "
                             f"{sorted(shapes)} in {files}")
        (self.seq, self.predictions), = shapes
        self.ends = np.cumsum(sizes)  # [shard] one past its last row
        self.handles = None

    def __len__(self):
        return int(self.ends[-1])

    def __getitems__(self, indices):
        if self.handles is None:
            import h5py

            self.handles = [h5py.File(name, "r") for name in self.files]
        indices = np.asarray(indices, dtype=np.int64)
        shard_of = np.searchsorted(self.ends, indices, side="right")
        parts = {k: [] for k in FIELDS}
        for shard in np.unique(shard_of):
            rows = np.sort(indices[shard_of == shard] - (self.ends[shard - 1] if shard else 0))
            for k in FIELDS:
                parts[k].append(self.handles[shard][k][rows])
        return {k: np.concatenate(v) for k, v in parts.items()}


class Synthetic(torch.utils.data.Dataset):
    """Random rows of the shards' layout: 128 tokens, none padded, 20 masked positions per sequence."""

    def __init__(self, size, vocab_size, seq=128, predictions=20):
        self.size, self.vocab, self.seq, self.predictions = size, vocab_size, seq, predictions

    def __len__(self):
        return self.size

    def __getitems__(self, indices):
        rng = np.random.RandomState(int(indices[0]))
        b = len(indices)
        positions = np.stack([rng.permutation(self.seq - 1)[:self.predictions] + 1 for _ in range(b)])
        return {"input_ids": rng.randint(0, self.vocab, (b, self.seq)), "segment_ids": np.zeros((b, self.seq)),
                "input_mask": np.ones((b, self.seq)), "masked_lm_positions": positions,
                "masked_lm_ids": rng.randint(0, self.vocab, positions.shape), "next_sentence_labels": rng.randint(0, 2, b)}


class Collate:
    """Rows (numpy, the shards' fields) to the tensors of an update, all found on the CPU: the flat masked
    positions b * S + s of HetSeq's labels with their targets and sequences, 1 / (masked count) per sequence,
    and the attention mask, None when no sequence is padded (unless `always_mask`). With `pad_to` the masked
    positions are padded to that count with position 0 and target IGNORE (static shapes for --compile)."""

    def __init__(self, pad_to=None, always_mask=False):
        self.pad_to, self.always_mask = pad_to, always_mask

    def __call__(self, rows):
        ids = rows["input_ids"].astype(np.int64)
        b, s = ids.shape
        positions = rows["masked_lm_positions"].astype(np.int64)
        real = np.cumprod(positions != 0, axis=1).astype(bool)  # [b, P] HetSeq: the positions before the first 0
        sequence, slot = np.nonzero(real)  # [M]
        index = sequence * s + positions[sequence, slot]
        targets = rows["masked_lm_ids"][sequence, slot].astype(np.int64)
        masked = int(index.shape[0])
        if self.pad_to is not None:
            if masked > self.pad_to:
                raise AssertionError(f"{masked} masked positions in a batch of {b}, more than the pad of {self.pad_to}")
            fill = self.pad_to - masked
            index = np.concatenate([index, np.zeros(fill, np.int64)])
            targets = np.concatenate([targets, np.full(fill, IGNORE, np.int64)])
            sequence = np.concatenate([sequence, np.zeros(fill, np.int64)])
        mask = rows["input_mask"] != 0
        padded = not mask.all()
        return {
            "input_ids": torch.from_numpy(ids),
            "segment_ids": torch.from_numpy(rows["segment_ids"].astype(np.int64)),
            "attend": torch.from_numpy(mask[:, None, None, :]) if padded or self.always_mask else None,
            "masked_index": torch.from_numpy(index),
            "masked_targets": torch.from_numpy(targets),
            "masked_sequence": torch.from_numpy(sequence.astype(np.int64)),
            "inverse_count": torch.from_numpy((1.0 / np.maximum(real.sum(1), 1)).astype(np.float32)),
            "next_sentence_labels": torch.from_numpy(rows["next_sentence_labels"].astype(np.int64).reshape(-1)),
            "masked": masked,  # real masked positions of the batch
        }


class UpdatePlan(torch.utils.data.Sampler):
    """This rank's sorted dataset indices for each of `updates` updates (see the module docstring)."""

    def __init__(self, size, batch_size, workers, rank, seed, updates):
        self.size, self.batch_size, self.workers, self.rank = size, batch_size, workers, rank
        self.seed, self.updates = seed, updates
        self.per_epoch = size // (batch_size * workers)
        if self.per_epoch == 0:
            raise SystemExit(f"bert_python_peer.py: error: {size} train sequences, fewer than one update of "
                             f"{batch_size} x {workers}; lower --batch-size")

    def __len__(self):
        return self.updates

    def __iter__(self):
        per_update = self.batch_size * self.workers
        for u in range(self.updates):
            epoch, k = divmod(u, self.per_epoch)
            if k == 0:
                order = np.random.RandomState(self.seed + epoch).permutation(self.size)
            chunk = order[k * per_update:(k + 1) * per_update]
            yield sorted(chunk[self.rank * self.batch_size:(self.rank + 1) * self.batch_size].tolist())


def make_loader(args, data, collate, rank, batches, device):
    plan = UpdatePlan(len(data), args.batch_size, args.workers, rank, args.seed, batches)
    extra = dict(prefetch_factor=args.prefetch_factor, persistent_workers=True) if args.loader_workers > 0 else {}
    return torch.utils.data.DataLoader(data, batch_sampler=plan, collate_fn=collate, num_workers=args.loader_workers,
                                       pin_memory=device.type == "cuda", **extra)


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.workers > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    with open(args.config) as f:
        config = json.load(f)
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    if args.synthetic:
        data = Synthetic(args.synthetic, config["vocab_size"])
    else:
        data = Shards(sorted(glob.glob(os.path.join(args.data, "*train*"))))
    seq, predictions = data.seq, data.predictions
    collate = Collate(pad_to=args.batch_size * predictions if args.compile else None,
                      always_mask=args.compile and not args.synthetic)
    # warm-up, timed, and one profiled update; the workers start reading now, while the model is built.
    loader_iter = iter(make_loader(args, data, collate, rank, args.warmup + args.updates + 1, device))

    bert = BertForPreTraining(config).to(device)
    parameters = sum(p.numel() for p in bert.parameters())
    assert parameters == bert_flops.parameter_count(config), (parameters, bert_flops.parameter_count(config))
    step_module = PreTrainingLoss(bert)
    if args.workers > 1:
        step_module = nn.parallel.DistributedDataParallel(step_module, gradient_as_bucket_view=True)
    if args.compile:
        step_module = torch.compile(step_module, mode=args.compile_mode)
    opt = torch.optim.AdamW(bert.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay, fused=True)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    # fp16: hetseq's defaults (start scale 128, doubled after 16384 / workers updates without overflow).
    scaler = (torch.amp.GradScaler(device.type, init_scale=128.0, growth_interval=16384 // args.workers)
              if args.precision == "fp16" else None)
    bert.train()

    def update():
        """One update. Returns (loss sum on the device, host seconds waiting for data, the batch)."""
        t0 = time.perf_counter()
        batch = next(loader_iter)
        batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        waited = time.perf_counter() - t0
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = step_module(batch["input_ids"], batch["segment_ids"], batch["attend"], batch["masked_index"],
                               batch["masked_targets"], batch["masked_sequence"], batch["inverse_count"],
                               batch["next_sentence_labels"])
        # The gradient of the mean over the update's sequences: DDP averages over ranks, and every rank has
        # --batch-size sequences.
        mean = loss / args.batch_size
        if scaler is not None:
            scaler.scale(mean).backward()
            scaler.step(opt)
            scaler.update()
        else:
            mean.backward()
            if args.clip_norm > 0:  # foreach norm and a clamped coefficient on the device: no host sync
                torch.nn.utils.clip_grad_norm_(bert.parameters(), args.clip_norm, foreach=True)
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), waited, batch

    for _ in range(args.warmup):
        update()

    waits, hosts, masked, mask_updates = [], [], 0, 0
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.updates)]
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        torch.cuda.synchronize()
        span[0].record()
    start = time.perf_counter()
    for u in range(args.updates):
        t0 = time.perf_counter()
        if cuda:
            events[u][0].record()
        loss, waited, batch = update()
        if cuda:
            events[u][1].record()
        hosts.append(time.perf_counter() - t0)
        waits.append(waited)
        masked += batch["masked"]
        mask_updates += batch["attend"] is not None
    if cuda:
        span[1].record()
        torch.cuda.synchronize()
        seconds = span[0].elapsed_time(span[1]) / 1e3
        device_ms = [a.elapsed_time(b) for a, b in events]
    else:
        seconds = time.perf_counter() - start
        device_ms = [h * 1e3 for h in hosts]
    final_loss = loss.item() / args.batch_size / math.log(2)

    # One more update, untimed, under the profiler: its ATen operators, nested ones included. Backward runs
    # on autograd's threads on CUDA; the profiler's state travels to them with the thread-local state. On
    # CUDA the same update also counts the operations that made the host wait for the device (CUDA's sync
    # debug mode warns at each).
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        update()
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
    aten_ops = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    host_syncs = sum("synchroniz" in str(w.message) for w in caught) if cuda else None

    if args.workers > 1:
        totals = torch.tensor([masked], dtype=torch.float64)
        dist.all_reduce(totals)
        masked = totals.item()
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.item()
    if rank == 0:
        sequences = args.updates * args.batch_size * args.workers
        per_sequence = masked / sequences
        model_flops = bert_flops.model_flops_per_sequence(config, seq, per_sequence)
        flops_6nt = bert_flops.flops_6nt_per_sequence(config, seq)
        sequences_per_s = sequences / seconds
        peak = bert_flops.peak_flops(torch.cuda.get_device_name(device), args.precision) if cuda else None
        per_device = sequences_per_s / args.workers
        peak_memory = torch.cuda.max_memory_allocated(device) if cuda else \
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result = {
            "system": "peer-compiled" if args.compile else "peer",
            "batch": args.batch_size, "workers": args.workers, "seq_length": seq, "max_predictions": predictions,
            "warmup_updates": args.warmup, "timed_updates": args.updates, "seconds": seconds,
            "sequences_per_s": sequences_per_s,
            "model_flops_per_sequence": model_flops, "flops_6nt_per_sequence": flops_6nt,
            "masked_per_sequence": per_sequence,
            "mfu_model": per_device * model_flops / peak if peak else None,
            "mfu_6nt": per_device * flops_6nt / peak if peak else None,
            "peak_flops": peak,
            "aten_ops_per_update": aten_ops,
            "host_syncs_per_update": host_syncs,
            "data_wait_ms": statistics.median(waits) * 1e3, "host_ms": statistics.median(hosts) * 1e3,
            "device_ms": statistics.median(device_ms),
            "attention_mask_updates": mask_updates,
            "peak_memory_bytes": peak_memory,
            "final_loss": final_loss,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "precision": args.precision, "compile_mode": args.compile_mode if args.compile else None,
            "loader_workers": args.loader_workers, "threads": args.threads,
            "data": "synthetic" if args.synthetic else "shards",
            "parameters": parameters,
        }
        print(json.dumps(result), flush=True)
    if args.workers > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory with *train* HDF5 shards (required without --synthetic)")
    parser.add_argument("--config", required=True, help="bert_config.json")
    parser.add_argument("--warmup", type=int, default=20, help="updates before the timed ones (compiles there)")
    parser.add_argument("--updates", type=int, default=100, help="timed updates")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per worker and update")
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2), help="2: DDP over Gloo, CPU only")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--loader-workers", type=int, default=2, help="DataLoader processes per worker (0: inline)")
    parser.add_argument("--prefetch-factor", type=int, default=4, help="batches each loader process reads ahead")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip-norm", type=float, default=0.0,
                        help="clip the gradient norm to this (0: no clipping), as hetseq's --clip-norm")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="fp32, or the forward under autocast in bf16 or fp16 (fp16 with a GradScaler)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPU 0, one worker")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model and its loss")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    parser.add_argument("--synthetic", type=int, default=0, metavar="N",
                        help="N random sequences of the shards' shapes instead of --data")
    args = parser.parse_args()
    if not args.synthetic and not args.data:
        parser.error("--data is required without --synthetic")
    if args.device == "cuda" and args.workers != 1:
        parser.error("--device cuda runs one worker")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    for flag, value, low in (("--warmup", args.warmup, 0), ("--updates", args.updates, 1),
                             ("--batch-size", args.batch_size, 1), ("--threads", args.threads, 1),
                             ("--loader-workers", args.loader_workers, 0), ("--prefetch-factor", args.prefetch_factor, 1)):
        if value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if args.workers == 1:
        run(0, args, 0)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(args, port), nprocs=args.workers)


if __name__ == "__main__":
    main()
