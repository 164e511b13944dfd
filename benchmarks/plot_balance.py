#!/usr/bin/env python3
"""Plots one changing-load run of benchmarks/balance.sh: hetseq --auto-balance against the equal split.

Reads rank 0's timestamped stdout of each run (lines "UNIX_SECONDS {json}", as balance.sh's reader writes
them; the JSON train lines carry "num_updates" and "split", one line per update with --log-interval 1)
and the times the busy loop on CPU 1 started and stopped, and writes a PNG:

  top:    the auto run's split (samples of each rank per update) over time;
  bottom: samples/s over time, rolling over --window updates, of the auto and the equal run.

Times are seconds since each run's first update; the load phase is shaded (the auto run's window; the
equal run's, placed the same number of seconds after its first update, is drawn as dotted lines when
it differs by more than half a second).

    plot_balance.py --auto LOG --auto-load START,STOP --equal LOG --equal-load START,STOP --out PNG
"""

import argparse
import json
import sys


def read_updates(path):
    """[(time, num_updates, split)] of the train lines of one timestamped log, in order."""
    out = []
    with open(path) as f:
        for line in f:
            stamp, _, rest = line.partition(" ")
            if not rest.strip().startswith("{"):
                continue
            row = json.loads(rest)
            if row.get("tag") != "train":
                continue
            out.append((float(stamp), int(row["num_updates"]), [int(v) for v in row.get("split", [])]))
    if len(out) < 2:
        raise SystemExit(f"{path}: fewer than two timestamped train lines (run with --log-interval 1)")
    return out


def window(text, flag):
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"{flag}: '{text}' is not START,STOP (Unix seconds)")
    if b <= a:
        raise SystemExit(f"{flag}: the stop {b} is not after the start {a}")
    return a, b


def rolling(updates, n):
    """(times, samples/s) over the last n updates, from the n-th update on."""
    times, rates = [], []
    for i in range(n, len(updates)):
        span = updates[i][0] - updates[i - n][0]
        samples = sum(sum(u[2]) for u in updates[i - n + 1 : i + 1])
        if span > 0:
            times.append(updates[i][0])
            rates.append(samples / span)
    return times, rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--auto", required=True, help="rank 0's timestamped stdout of the --auto-balance run")
    ap.add_argument("--auto-load", required=True, help="START,STOP of its load (Unix seconds)")
    ap.add_argument("--equal", required=True, help="rank 0's timestamped stdout of the equal-split run")
    ap.add_argument("--equal-load", required=True, help="START,STOP of its load (Unix seconds)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--window", type=int, default=10, help="updates per rolling samples/s (default 10)")
    args = ap.parse_args()
    if args.window < 1:
        raise SystemExit(f"--window: {args.window} must be a positive number of updates")
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"matplotlib is missing: {sys.executable} -m pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    auto, equal = read_updates(args.auto), read_updates(args.equal)
    if not auto[0][2]:
        raise SystemExit(f"{args.auto}: its train lines have no \"split\" (a run of one rank?)")
    for updates, name in ((auto, "--auto"), (equal, "--equal")):
        if any(not u[2] for u in updates):
            raise SystemExit(f"{name}: some train lines have no \"split\"")
    a0, e0 = auto[0][0], equal[0][0]
    auto_load = [t - a0 for t in window(args.auto_load, "--auto-load")]
    equal_load = [t - e0 for t in window(args.equal_load, "--equal-load")]

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5), gridspec_kw={"height_ratios": [1, 1.3]})
    for ax in (top, bottom):
        ax.axvspan(*auto_load, color="tab:red", alpha=0.12, lw=0, label="busy loop on CPU 1")
        if max(abs(a - b) for a, b in zip(auto_load, equal_load)) > 0.5:
            for t in equal_load:
                ax.axvline(t, color="tab:red", ls=":", lw=1)
        ax.grid(alpha=0.3)

    times = [u[0] - a0 for u in auto]
    ranks = len(auto[0][2])
    for r in range(ranks):
        top.step(times, [u[2][r] for u in auto], where="post", label=f"rank {r} (CPU {r})")
    top.set_ylabel("samples per update")
    top.set_title("--auto-balance: each rank's share of the update's samples")
    top.legend(loc="upper right", fontsize=8)

    for updates, t0, label, color in ((auto, a0, "--auto-balance", "tab:blue"), (equal, e0, "equal split", "tab:gray")):
        t, rate = rolling(updates, args.window)
        bottom.plot([v - t0 for v in t], rate, label=label, color=color)
    bottom.set_ylabel(f"samples/s (last {args.window} updates)")
    bottom.set_xlabel("seconds since the run's first update")
    bottom.set_ylim(bottom=0)
    bottom.set_title("global training throughput")
    bottom.legend(loc="lower right", fontsize=8)

    total = sum(auto[0][2])
    fig.suptitle(f"hetseq MNIST, {ranks} ranks, {total} samples per update: a CPU-bound process on CPU 1")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
