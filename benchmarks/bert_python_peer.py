#!/usr/bin/env python3
"""The PyTorch (Python API) peer of `hetseq-train --task bert`, for throughput comparisons.

Pretrains the same BERT (a bert_config.json, e.g. configs/bert-tiny.json) on the same HDF5 shards the same way
hetseq does, in plain PyTorch from the same wheel, and prints one JSON line:

    {"sequences_per_s": ..., "updates": ..., "seconds": ..., "workers": ..., "batch_size": ..., "final_loss": ...}

The same as hetseq (tasks/bert/): post-LayerNorm BERT with word/position/token-type embeddings, fused attention
(torch.nn.functional.scaled_dot_product_attention with a boolean padding mask), exact GELU, pooler, MLM head on the
masked positions only with the decoder tied to the word embeddings, NSP head; BERT's initialisation (normal 0.02,
zero biases); the loss of Note [BERT loss and sample size] (per-sequence mean MLM cross-entropy plus NSP, summed,
gradients divided by the number of sequences); Adam (torch.optim.AdamW with weight decay --weight-decay, lr
constant) without gradient clipping; HetSeq's MLM labels from masked_lm_positions/ids; batches of --batch-size
sequences per worker from one seeded permutation of the train split, read with h5py row by row; one intra-op
thread per worker. With --workers 2, two processes with DistributedDataParallel over Gloo on 127.0.0.1.

Timed: from the start of the first update to the end of the last optimizer step (what hetseq's `ups` covers);
building the model and opening the shards come before.

--device cuda (one worker) trains on GPU 0 under CUDA autocast and adds the peak GPU memory to the JSON line;
--synthetic draws random batches of the shards' shapes (128 tokens, 20 masked positions) instead of reading shards,
for a machine without h5py (scripts/gpu_check.sh --run).
"""
import argparse
import glob
import json
import math
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.p_attn = c["attention_probs_dropout_prob"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out, self.attn_norm = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.inter, self.out, self.out_norm = nn.Linear(h, c["intermediate_size"]), nn.Linear(c["intermediate_size"], h), nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, x, attend):
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                             attn_mask=attend, dropout_p=self.p_attn if self.training else 0.0)
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

    def forward(self, ids, types, mask, masked_index):
        s = ids.shape[1]
        x = self.words(ids) + self.positions(torch.arange(s, device=ids.device)).unsqueeze(0) + self.types(types)
        x = self.emb_drop(self.emb_norm(x))
        attend = mask.ne(0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attend)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        sel = x.reshape(-1, x.shape[-1]).index_select(0, masked_index)
        t = self.transform_norm(F.gelu(self.transform(sel)))
        return F.linear(t, self.words.weight, self.decoder_bias), self.nsp(pooled)


def loss_of(model, batch):
    ids, types, mask, labels, nsl = batch
    b, s = labels.shape
    flat = labels.reshape(-1)
    masked = flat.ne(-1).nonzero().squeeze(1)
    targets = flat.index_select(0, masked)
    seq = torch.div(masked, s, rounding_mode="floor")
    mlm_logits, nsp_logits = model(ids, types, mask, masked)
    tok = F.cross_entropy(mlm_logits, targets, reduction="none")
    per_sum = torch.zeros(b, device=tok.device).index_add(0, seq, tok.float())
    per_cnt = torch.zeros(b, device=tok.device).index_add(0, seq, torch.ones_like(tok, dtype=torch.float32))
    return (per_sum / per_cnt.clamp_min(1)).sum() + F.cross_entropy(nsp_logits, nsl, reduction="sum")


class Shards:
    def __init__(self, files):
        import h5py  # only here: --synthetic runs without it

        self.files = [h5py.File(f, "r") for f in files]
        self.ends = np.cumsum([f["input_ids"].shape[0] for f in self.files])

    def __len__(self):
        return int(self.ends[-1])

    def batch(self, indices):
        rows = {k: [] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                                "next_sentence_labels")}
        for i in indices:
            f = int(np.searchsorted(self.ends, i, side="right"))
            r = int(i - (self.ends[f - 1] if f else 0))
            for k in rows:
                rows[k].append(self.files[f][k][r])
        t = {k: torch.from_numpy(np.stack(v).astype(np.int64)) for k, v in rows.items()}
        labels = torch.full_like(t["input_ids"], -1)
        for j in range(labels.shape[0]):
            pos, ids = t["masked_lm_positions"][j], t["masked_lm_ids"][j]
            n = int((pos != 0).cumprod(0).sum())
            labels[j, pos[:n]] = ids[:n]
        return t["input_ids"], t["segment_ids"], t["input_mask"], labels, t["next_sentence_labels"].view(-1)


class Synthetic:
    """Random batches of the shards' shapes: 128 tokens, all attended, 20 masked positions per sequence."""

    def __init__(self, size, vocab_size, seq=128, predictions=20):
        self.size, self.vocab, self.seq, self.predictions = size, vocab_size, seq, predictions

    def __len__(self):
        return self.size

    def batch(self, indices):
        g = torch.Generator().manual_seed(int(indices[0]))
        b = len(indices)
        ids = torch.randint(0, self.vocab, (b, self.seq), generator=g)
        labels = torch.full_like(ids, -1)
        pos = torch.stack([torch.randperm(self.seq - 1, generator=g)[:self.predictions] + 1 for _ in range(b)])
        labels.scatter_(1, pos, torch.randint(0, self.vocab, pos.shape, generator=g))
        return (ids, torch.zeros_like(ids), torch.ones_like(ids), labels,
                torch.randint(0, 2, (b,), generator=g))


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.workers > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    with open(args.config) as f:
        config = json.load(f)
    device = torch.device(args.device)
    model = BertForPreTraining(config).to(device)
    step_model = nn.parallel.DistributedDataParallel(model) if args.workers > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    # fp16: hetseq's defaults (start scale 128, doubled after 16384 / workers updates without overflow).
    scaler = (torch.amp.GradScaler(device.type, init_scale=128.0, growth_interval=16384 // args.workers)
              if args.precision == "fp16" else None)
    if args.synthetic:
        data = Synthetic(args.synthetic, config["vocab_size"])
    else:
        data = Shards(sorted(glob.glob(os.path.join(args.data, "*train*"))))
    order = np.random.RandomState(args.seed).permutation(len(data))
    per_update = args.batch_size * args.workers
    model.train()
    start = time.perf_counter()
    loss_value = float("nan")
    for u in range(args.updates):
        chunk = order[u * per_update:(u + 1) * per_update]
        batch = data.batch(sorted(chunk[rank * args.batch_size:(rank + 1) * args.batch_size]))
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        opt.zero_grad()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_of(step_model, batch)
        # Gradient of the mean over all sequences of the update (DDP averages over ranks, so divide by the
        # per-rank count, as every rank has the same).
        mean = loss.float() / args.batch_size
        if scaler is not None:
            scaler.scale(mean).backward()
            scaler.step(opt)
            scaler.update()
        else:
            mean.backward()
            opt.step()
        loss_value = loss.item() / args.batch_size
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if rank == 0:
        result = {"sequences_per_s": args.updates * per_update / seconds, "updates": args.updates,
                  "seconds": seconds, "workers": args.workers, "batch_size": args.batch_size,
                  "final_loss_bits": loss_value / math.log(2), "device": str(device),
                  "parameters": sum(p.numel() for p in model.parameters())}
        if device.type == "cuda":
            result["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
        print(json.dumps(result), flush=True)
    if args.workers > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory with *train* HDF5 shards (required without --synthetic)")
    parser.add_argument("--config", required=True, help="bert_config.json")
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per worker and update")
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2))
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="forward passes under autocast (fp16 with a GradScaler)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPU 0, one worker")
    parser.add_argument("--synthetic", type=int, default=0, metavar="N",
                        help="N random sequences of the shards' shapes instead of --data")
    args = parser.parse_args()
    if not args.synthetic and not args.data:
        parser.error("--data is required without --synthetic")
    if args.device == "cuda" and args.workers != 1:
        parser.error("--device cuda runs one worker")
    if args.workers == 1:
        run(0, args, 0)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(args, port), nprocs=args.workers)


if __name__ == "__main__":
    main()
