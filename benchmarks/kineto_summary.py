#!/usr/bin/env python3
"""Summarises a LibTorch (Kineto) trace of a few updates, as hetseq-train --trace-dir DIR --trace-ops writes it
(DIR/ops_rank<R>.json, Chrome trace format), or as torch.profiler exports it.

    kineto_summary.py TRACE --updates N [--top 20]

Prints one JSON line:
  {"updates": N, "kernels_per_update": .., "kernel_ms_per_update": .., "span_ms_per_update": ..,
   "gpu_idle_fraction": .., "host_syncs_per_update": .., "cpu_ops_per_update": .., "top_kernels": [
   {"name": .., "calls": .., "total_ms": .., "share": ..}, ...]}
- kernels: events of category "kernel" (GPU kernels; memcpy and memset count apart, as "gpu_memcpy"/"gpu_memset");
- the GPU's idle fraction: 1 - (time covered by at least one kernel, memcpy or memset) / (first start to last end);
- host syncs: CUDA runtime calls that make the host wait (cudaStreamSynchronize, cudaDeviceSynchronize,
  cudaEventSynchronize, and a cudaMemcpy that is not Async), matched by prefix (versioned names included);
- cpu_ops: events of category "cpu_op" (ATen operators, nested ones included).
A trace of a CPU-only run has no kernels: the GPU figures are then null.
"""
import argparse
import collections
import json

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def is_sync(name):
    """A runtime call that makes the host wait, matched by prefix: CUDA's traces name versions of a call too
    (cudaStreamSynchronize_ptsz, cudaMemcpy_v2); an Async copy does not wait."""
    return name.startswith(SYNC_CALLS) and "Async" not in name


def union_ms(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1e3  # microseconds in Chrome traces


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--updates", type=int, required=True, help="updates the trace covers")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    n = max(1, args.updates)
    kernels = collections.defaultdict(lambda: [0, 0.0])
    device_intervals, kernel_count, kernel_us, syncs, cpu_ops = [], 0, 0.0, 0, 0
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name, dur = e.get("cat", ""), e.get("name", ""), float(e.get("dur", 0))
        if cat == "kernel":
            kernels[name][0] += 1
            kernels[name][1] += dur
            kernel_count += 1
            kernel_us += dur
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            device_intervals.append((float(e["ts"]), float(e["ts"]) + dur))
        if cat == "cuda_runtime" and is_sync(name):
            syncs += 1
        if cat == "cpu_op":
            cpu_ops += 1
    out = {"updates": n, "cpu_ops_per_update": cpu_ops / n}
    if device_intervals:
        span = (max(b for _, b in device_intervals) - min(a for a, _ in device_intervals)) / 1e3
        out.update({"kernels_per_update": kernel_count / n, "kernel_ms_per_update": kernel_us / 1e3 / n,
                    "span_ms_per_update": span / n,
                    "gpu_idle_fraction": 1 - union_ms(device_intervals) / span if span > 0 else None,
                    "host_syncs_per_update": syncs / n})
        top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]
        out["top_kernels"] = [{"name": k[:160], "calls": c, "total_ms": us / 1e3, "share": us / kernel_us}
                              for k, (c, us) in top]
    else:
        out.update({"kernels_per_update": None, "kernel_ms_per_update": None, "span_ms_per_update": None,
                    "gpu_idle_fraction": None, "host_syncs_per_update": None, "top_kernels": []})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
