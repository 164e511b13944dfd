#!/usr/bin/env python3
"""Draws a merged hetseq trace (Chrome trace-event JSON) as a timeline PNG, for a look without Perfetto.

    plot_trace.py TRACE.json [-o OUT.png] [--updates A:B]

One band per rank (rank 0 on top), labelled with its process name, holding a row for the train thread,
one for the device (CUDA events) if traced, and a thin one per allreduce bucket. Nested spans are drawn
inside their parent: an "update" is a light outlined bar with its parts coloured on it, and comm_wait
(red) sits inside the last backward, so one sees which rank waits for which rank's backward and how the
bucket allreduces overlap backward. Note [Tracing] in hetseq/observe/tracer.cpp says what spans mean.

The window covers the "update" spans whose args.index is in A..B (default: the first 3 updates in the
trace); x is in ms from its start. OUT defaults to TRACE with .png. Prints the path written; a missing
or invalid file, or one without complete ("X") events, exits 1 with one line naming it.
"""

import argparse
import collections
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {"forward": "tab:blue", "backward": "tab:green", "comm_wait": "red", "allreduce": "tab:orange",
           "optimizer": "tab:purple", "data": "tab:brown", "stat_sync": "tab:cyan", "clip_grad": "tab:olive",
           "other": "tab:gray"}
UPDATE_FACE, UPDATE_EDGE = "#eeeeee", "#555555"
ROW_HEIGHT = {"train": 1.0, "device": 0.8, "bucket": 0.4}  # y extent of a row; bands are stacked downwards
BAR_HEIGHT = (0.9, 0.7, 0.45, 0.3)  # [nesting depth] fraction of the row a span's bar fills
BAND_GAP = 0.7  # room above each band for its rank label
TRAIN_TID, DEVICE_TID, BUCKET_TID = 1, 2, 100


def fail(message):
    sys.exit(f"plot_trace.py: {message}")


def parse_updates(text):
    a, sep, b = text.partition(":")
    if not (sep and a.strip().isdigit() and b.strip().isdigit()) or int(a) > int(b):
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B, the first and last update to draw (A <= B)")
    return int(a), int(b)


def load(path):
    """Returns ({pid: process name}, [X events]) of a trace file, or exits naming the file."""
    try:
        events = json.loads(path.read_text())["traceEvents"]
        names = {int(e["pid"]): e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        spans = [e for e in events if e.get("ph") == "X"]
        for e in spans:
            e["ts"], e["dur"], e["pid"], e["tid"] = float(e["ts"]), float(e["dur"]), int(e["pid"]), int(e["tid"])
    except OSError as e:
        fail(f"{path}: cannot read the trace: {e.strerror or e}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        fail(f"{path}: not a hetseq trace (Chrome trace-event JSON, an object with a traceEvents list): {e!r}")
    if not spans:
        fail(f"{path}: no complete (\"X\") events; was the trace window (--trace-updates) reached?")
    return names, spans


def pick_window(path, spans, wanted):
    """Returns (first update, last update, start µs, end µs) of the update spans drawn."""
    updates = [e for e in spans if e["name"] == "update" and isinstance(e.get("args", {}).get("index"), int)]
    present = sorted({e["args"]["index"] for e in updates})
    if not present:
        fail(f"{path}: no \"update\" spans with an index to place the window on")
    lo, hi = wanted or (present[0], present[min(2, len(present) - 1)])
    chosen = [e for e in updates if lo <= e["args"]["index"] <= hi]
    if not chosen:
        fail(f"{path}: no update in --updates {lo}:{hi}; the trace has updates {present[0]}..{present[-1]}")
    indices = [e["args"]["index"] for e in chosen]
    return min(indices), max(indices), min(e["ts"] for e in chosen), max(e["ts"] + e["dur"] for e in chosen)


def with_depth(row):
    """Yields (span, nesting depth) for the spans of one row, parents before their children."""
    open_ends = []  # ends (µs) of the spans enclosing the current one
    for e in sorted(row, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        yield e, len(open_ends)
        open_ends.append(e["ts"] + e["dur"])


def draw_row(ax, row, top, height, t0, t1):
    for e, depth in with_depth(row):
        begin, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if end <= begin:
            continue
        bar = height * BAR_HEIGHT[min(depth, len(BAR_HEIGHT) - 1)]
        is_update = e["name"] == "update"
        ax.barh(top + height / 2, (end - begin) / 1e3, left=(begin - t0) / 1e3, height=bar, zorder=2 + depth,
                color=UPDATE_FACE if is_update else COLOURS.get(e["name"], COLOURS["other"]),
                edgecolor=UPDATE_EDGE if is_update else "none", linewidth=0.8)


def plot(names, spans, window, out):
    first, last, t0, t1 = window
    rows = collections.defaultdict(list)  # [(pid, tid)] spans of that thread
    for e in spans:
        if e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            rows[(e["pid"], e["tid"])].append(e)
    ranks = sorted({e["pid"] for e in spans})
    fig, ax = plt.subplots(figsize=(16, 2 + 1.5 * len(ranks)), dpi=100)
    ticks, tick_labels, y = [], [], 0.0
    for rank in ranks:
        band_top = y + BAND_GAP
        ax.text(0.003, band_top - 0.22, names.get(rank, f"rank {rank}"), transform=ax.get_yaxis_transform(),
                ha="left", va="bottom", fontsize=10, fontweight="bold")
        y = band_top
        tids = sorted(tid for pid, tid in rows if pid == rank)
        for tid in tids:
            kind = "train" if tid == TRAIN_TID else "device" if tid == DEVICE_TID else "bucket"
            height = ROW_HEIGHT[kind]
            draw_row(ax, rows[(rank, tid)], y, height, t0, t1)
            ticks.append(y + height / 2)
            tick_labels.append(f"bucket {tid - BUCKET_TID}" if kind == "bucket" else kind)
            y += height
        for e in rows[(rank, TRAIN_TID)]:
            if e["name"] == "update" and e["ts"] >= t0:
                x = (e["ts"] - t0) / 1e3
                ax.vlines(x, band_top, y, colors="#999999", linestyles=":", linewidth=0.8, zorder=1)
                ax.text(x, band_top, f" update {e['args'].get('index')}", fontsize=7, color="#555555",
                        va="bottom", ha="left", clip_on=True)
    ax.set_yticks(ticks, tick_labels, fontsize=8)
    ax.set_ylim(y + 0.1, 0)
    ax.set_xlim(-0.005 * (t1 - t0) / 1e3, 1.005 * (t1 - t0) / 1e3)
    ax.set_xlabel("time (ms) from the start of the window")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5, zorder=0)
    legend = [Patch(facecolor=UPDATE_FACE, edgecolor=UPDATE_EDGE, label="update")]
    legend += [Patch(color=colour, label=name) for name, colour in COLOURS.items()]
    ax.legend(handles=legend, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(legend), frameon=False,
              fontsize=9)
    updates = f"update {first}" if first == last else f"updates {first}-{last}"
    ax.set_title(f"hetseq trace: {updates}, {len(ranks)} rank{'s' if len(ranks) != 1 else ''}", pad=28)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        fail(f"{out}: cannot write the PNG: {e.strerror or e}")
    plt.close(fig)
    print(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, metavar="TRACE.json", help="merged hetseq trace (Chrome trace-event JSON)")
    ap.add_argument("-o", "--out", type=Path, metavar="OUT.png", help="the PNG to write (default: TRACE.png)")
    ap.add_argument("--updates", type=parse_updates, metavar="A:B", help="updates to draw (default: the first 3)")
    args = ap.parse_args()
    names, spans = load(args.trace)
    plot(names, spans, pick_window(args.trace, spans, args.updates), args.out or args.trace.with_suffix(".png"))


if __name__ == "__main__":
    main()
