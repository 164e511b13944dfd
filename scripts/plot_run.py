#!/usr/bin/env python3
"""Turns hetseq JSON logs (--log-format json) into PNG figures, one PNG per figure.

    plot_run.py LOG [LOG ...] [-o OUTDIR] [--label NAME ...]

Several logs are overlaid in each figure, one colour per run, to compare runs; --label names them in
that order (default: each log's file stem, or its parent folder's name when the stems collide). OUTDIR
defaults to plots/ next to the first log. Prints the path of each PNG written:

    loss.png        train and valid loss (per subset) against updates and against wall time (s)
    lr.png          learning rate against updates
    throughput.png  samples/s (bsz * ups) against updates, and words/s (wps) when it differs
    ranks.png       per-rank compute and communication wait in ms per update (only with "ranks" or
                    "ranks_epoch" records)
    split.png       per-rank samples per update (only with a "split" over 2+ ranks)

Lines that are not JSON objects (text log lines captured with stdout) are skipped; missing keys drop
their curve or figure. Train curves use the "train" records, or "train_epoch" when a log has none.
Wall time is "wall_s" where present, else "wall"; a valid record without either takes the wall time
of the train records at its num_updates (the end of its epoch, before validation ran).
"""

import argparse
import collections
import itertools
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

FIGSIZE, DPI = (14, 9), 100  # 1400 x 900 px
TAGS = ("train", "train_epoch", "valid", "ranks", "ranks_epoch")
VALID_MARKERS = "osD^v"


def fail(message):
    sys.exit(f"plot_run.py: {message}")


def read_log(path):
    """The log's records by tag ({tag: [record]}, in file order); exits naming PATH when it is unusable."""
    records = {tag: [] for tag in TAGS}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("tag") in records:
                    records[obj["tag"]].append(obj)
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except OSError as e:
        fail(f"{path}: cannot be read: {e.strerror or e}")
    if not records["train"] and not records["train_epoch"]:
        fail(f"{path}: no train records (is it a hetseq log written with --log-format json?)")
    return records


class Run:
    """One log to plot: its records, its name and its colour; earlier runs draw thicker lines, so that a later
    run with the same values does not hide them."""
    def __init__(self, path, label, index, count):
        self.label, self.color = label, f"C{index % 10}"
        self.width = 1.5 + 1.5 * (count - 1 - index) / max(1, count - 1)  # points
        self.records = read_log(path)
        self.train = self.records["train"] or self.records["train_epoch"]


def num(value):
    """A finite float, or NaN for anything else (missing, null, a string, a bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def col(records, key):
    return np.array([num(r.get(key)) for r in records], dtype=float)


def wall(records):
    """Seconds since the run started, per record: "wall_s", else the integer "wall"."""
    def seconds(r):
        s = num(r.get("wall_s"))
        return num(r.get("wall")) if math.isnan(s) else s
    return np.array([seconds(r) for r in records], dtype=float)


def per_rank(records, key, ranks):
    """[record][rank] matrix of a columnar per-rank key, NaN where absent."""
    out = np.full((len(records), ranks), math.nan)
    for i, r in enumerate(records):
        values = r.get(key)
        if isinstance(values, list):
            for k, v in enumerate(values[:ranks]):
                out[i, k] = num(v)
    return out


def line(ax, x, y, **kw):
    """Plots the points where both x and y are known; returns whether there were any."""
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.any():
        ax.plot(x[keep], y[keep], **kw)
    return bool(keep.any())


def finish(fig, out_dir, name):
    path = out_dir / name
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as e:
        fail(f"{path}: cannot be written: {e.strerror or e}")
    plt.close(fig)
    print(path)


def plot_loss(runs, out_dir):
    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=FIGSIZE)
    timed = False
    for run in runs:
        updates, loss, seconds = col(run.train, "num_updates"), col(run.train, "loss"), wall(run.train)
        style = dict(color=run.color, linewidth=run.width, label=f"{run.label} train")
        line(by_update, updates, loss, **style)
        timed |= line(by_time, seconds, loss, **style)
        # Train and epoch-end records map updates to seconds for valid records that carry no time.
        known = run.records["train"] + run.records["train_epoch"]
        u, s = col(known, "num_updates"), wall(known)
        keep = np.isfinite(u) & np.isfinite(s)
        order = np.argsort(u[keep])
        u, s = u[keep][order], s[keep][order]
        by_subset = collections.defaultdict(list)
        for r in run.records["valid"]:
            by_subset[r.get("subset", "valid")].append(r)
        for marker, (subset, recs) in zip(itertools.cycle(VALID_MARKERS), by_subset.items()):
            vu, vloss, vs = col(recs, "num_updates"), col(recs, "loss"), wall(recs)
            if len(u):
                vs = np.where(np.isfinite(vs), vs, np.interp(vu, u, s))
            style = dict(color=run.color, marker=marker, linestyle=":", markersize=7, label=f"{run.label} {subset}")
            line(by_update, vu, vloss, **style)
            timed |= line(by_time, vs, vloss, **style)
    by_update.set(title="Loss against updates", xlabel="updates", ylabel="loss (base 2)")
    by_time.set(title="Loss against wall time", xlabel="wall time (s)", ylabel="loss (base 2)")
    if not timed:
        by_time.text(0.5, 0.5, "no wall time in the logs", ha="center", transform=by_time.transAxes)
    for ax in (by_update, by_time):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
    finish(fig, out_dir, "loss.png")


def plot_lr(runs, out_dir):
    fig, ax = plt.subplots(figsize=FIGSIZE)
    drawn = [line(ax, col(r.train, "num_updates"), col(r.train, "lr"), color=r.color, linewidth=r.width, label=r.label)
             for r in runs]
    if not any(drawn):
        return plt.close(fig)
    ax.set(title="Learning rate", xlabel="updates", ylabel="learning rate")
    ax.grid(True, alpha=0.3)
    ax.legend()
    finish(fig, out_dir, "lr.png")


def plot_throughput(runs, out_dir):
    fig, ax = plt.subplots(figsize=FIGSIZE)
    words_ax, drawn = None, False
    for run in runs:
        updates, wps = col(run.train, "num_updates"), col(run.train, "wps")
        bsz, wpb = col(run.train, "bsz"), col(run.train, "wpb")
        samples = bsz * col(run.train, "ups")
        samples = np.where(np.isfinite(samples) | (bsz != wpb), samples, wps)  # wps counts samples there
        drawn |= line(ax, updates, samples, color=run.color, linewidth=run.width, label=f"{run.label} samples/s")
        both = np.isfinite(samples) & np.isfinite(wps)
        if np.any(np.abs(wps[both] - samples[both]) > np.maximum(1.0, 0.02 * samples[both])):
            words_ax = words_ax or ax.twinx()
            drawn |= line(words_ax, updates, wps, color=run.color, linewidth=run.width, linestyle="--",
                          label=f"{run.label} words/s")
    if not drawn:
        return plt.close(fig)
    ax.set(title="Throughput", xlabel="updates", ylabel="samples/s (bsz x ups)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles = ax.get_lines() + (words_ax.get_lines() if words_ax else [])
    if words_ax:
        words_ax.set_ylabel("words/s (wps, dashed)")
        words_ax.set_ylim(bottom=0)
    ax.legend(handles=handles)
    finish(fig, out_dir, "throughput.png")


def plot_ranks(runs, out_dir):
    def ranks_of(r):
        return max(len(v) if isinstance(v, list) else 0 for v in (r.get("compute_ms"), r.get("wait_ms")))
    # The per-interval summaries ("ranks") draw the lines; a run without them falls back to its
    # per-epoch ones ("ranks_epoch"), whose last one also holds the balancer's suggestion.
    runs = [(run, [r for r in (run.records["ranks"] or run.records["ranks_epoch"]) if ranks_of(r)]) for run in runs]
    runs = [(run, recs) for run, recs in runs if recs]
    if not runs:
        return
    fig, axes = plt.subplots(len(runs), 1, figsize=FIGSIZE, squeeze=False)
    for ax, (run, recs) in zip(axes[:, 0], runs):
        n = max(ranks_of(r) for r in recs)
        compute, wait = per_rank(recs, "compute_ms", n), per_rank(recs, "wait_ms", n)
        slowest = collections.Counter(r.get("slowest") for r in recs if isinstance(r.get("slowest"), int))
        slowest = slowest.most_common(1)[0][0] if slowest else None
        names = [f"rank {k}" + (" (slowest)" if k == slowest else "") for k in range(n)]
        if len(recs) == 1:  # one summary: compute with the wait stacked on it, per rank
            for k in range(n):
                ax.bar(k, compute[0, k], color=f"C{k}", label=names[k])
                ax.bar(k, wait[0, k], bottom=compute[0, k], color=f"C{k}", alpha=0.35, hatch="//")
            ax.set(xticks=range(n), xticklabels=names, ylabel="ms per update (solid compute, hatched wait)")
        else:
            updates = col(recs, "num_updates")
            for k in range(n):
                line(ax, updates, compute[:, k], color=f"C{k}", label=names[k])
                line(ax, updates, wait[:, k], color=f"C{k}", linestyle="--")
            ax.set(xlabel="updates", ylabel="ms per update")
            ax.legend(handles=ax.get_legend_handles_labels()[0] + [
                Line2D([], [], color="k", label="compute"), Line2D([], [], color="k", linestyle="--", label="wait")])
        title = f"{run.label}: per-rank compute and communication wait"
        last = (run.records["ranks_epoch"] or recs)[-1]
        if isinstance(last.get("suggested_split"), list):
            title += f"; suggested split {last['suggested_split']}"
            if not math.isnan(num(last.get("predicted_gain"))):
                title += f", predicted gain {num(last['predicted_gain']):.3g}"
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if len(recs) == 1:
            ax.legend()
    finish(fig, out_dir, "ranks.png")


def plot_split(runs, out_dir):
    splits = []
    for run in runs:
        recs = [r for r in run.records["train"] if isinstance(r.get("split"), list) and len(r["split"]) >= 2]
        if recs:
            splits.append((run, recs))
    if not splits:
        return
    fig, axes = plt.subplots(len(splits), 1, figsize=FIGSIZE, squeeze=False)
    for ax, (run, recs) in zip(axes[:, 0], splits):
        updates, shares = col(recs, "num_updates"), per_rank(recs, "split", max(len(r["split"]) for r in recs))
        for k in range(shares.shape[1]):
            keep = np.isfinite(updates) & np.isfinite(shares[:, k])
            # Thinner lines for later ranks, so that ranks with equal shares all stay visible.
            ax.step(updates[keep], shares[keep, k], where="post", color=f"C{k}", label=f"rank {k}",
                    linewidth=max(1.0, 2.5 * (shares.shape[1] - k) / shares.shape[1] + 0.5))
        ax.set(title=f"{run.label}: samples per update by rank", xlabel="updates", ylabel="samples per update")
        ax.set_ylim(0, 1.1 * np.nanmax(shares))
        ax.grid(True, alpha=0.3)
        ax.legend()
    finish(fig, out_dir, "split.png")


def default_labels(paths):
    for names in ([p.stem for p in paths], [p.resolve().parent.name for p in paths]):
        if len(set(names)) == len(names):
            return names
    return [f"{p.stem} ({i})" for i, p in enumerate(paths, 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="hetseq JSON log (one object a line)")
    ap.add_argument("-o", "--outdir", type=Path, help="where the PNGs go (default: plots/ next to the first log)")
    ap.add_argument("--label", nargs="+", action="extend", default=[], metavar="NAME", help="one name per log")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.logs):
        fail(f"--label: {len(args.label)} names for {len(args.logs)} logs; give one name per log")
    labels = args.label or default_labels(args.logs)
    runs = [Run(path, label, i, len(labels)) for i, (path, label) in enumerate(zip(args.logs, labels))]
    out_dir = args.outdir or args.logs[0].parent / "plots"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"{out_dir}: cannot create the output folder: {e.strerror or e}")
    for plot in (plot_loss, plot_lr, plot_throughput, plot_ranks, plot_split):
        plot(runs, out_dir)


if __name__ == "__main__":
    main()
