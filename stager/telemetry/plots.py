"""The stall report's plots, as PNG files (matplotlib, the ``bench`` extra).

- ``timeline.png``: per rank, the share of each stage's workers busy and of
  the consumer's time spent waiting, over the run;
- ``stalls.png``: the wait in ``next()`` and the compute of every step, per rank;
- ``ranks.png``: each rank's loop split into compute, wait and other;
- ``counts.png``: the requests the prefetchers keep out and the readers, over
  the run (``auto`` changes them; flat for fixed counts).
"""

import os

MAX_RANKS = 8  # timeline panels; more ranks would make the figure unreadable

MISSING = ("no plots: matplotlib is not installed (pip install matplotlib, or the bench extra: "
           "pip install 'stager[bench]')")


class PlotsUnavailable(Exception):
    """matplotlib cannot be imported; the message says how to get it."""


def pyplot():
    """matplotlib's pyplot drawing to files only; ``PlotsUnavailable`` (saying how to get it) where it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(MISSING) from None
    matplotlib.use("Agg")  # files only: no display on a cluster node
    import matplotlib.pyplot as plt

    return plt


def timeline(report, path):
    plt = pyplot()
    ranks = report["per_rank"][:MAX_RANKS]
    fig, axes = plt.subplots(len(ranks), 1, figsize=(10, 1.8 + 1.6 * len(ranks)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], ranks):
        tl = r["timeline"]
        x = [(i + 0.5) * tl["bin_s"] for i in range(tl["bins"])]
        ax.fill_between(x, tl["wait"], step="mid", color="tab:red", alpha=0.35, label="consumer waiting")
        ax.step(x, tl["compute"], where="mid", color="tab:green", lw=1, label="consumer computing")
        if "prefetch_busy" in tl:
            ax.step(x, tl["prefetch_busy"], where="mid", color="tab:blue", lw=1.2,
                    label=f"prefetchers busy ({r['stages']['prefetch']['workers']})")
        ax.step(x, tl["read_busy"], where="mid", color="tab:orange", lw=1.2,
                label=f"readers busy ({r['stages']['read']['workers']})")
        ax.axvline(r["first_batch_s"], color="grey", ls=":", lw=1)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"rank {r['rank']}\nshare")
        ax.set_title(f"rank {r['rank']} on {r['node']}: stall {r['stall_fraction']:.0%}", fontsize=9, loc="left")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("seconds since the pipeline started (dotted: first minibatch)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def stalls(report, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in report["per_rank"]:
        s = r["series"]
        steps = [i * s["stride"] for i in range(len(s["wait"]))]
        per = 1e3 / s["stride"]
        ax.plot(steps, [w * per for w in s["wait"]], lw=1, label=f"rank {r['rank']} wait")
        ax.plot(steps, [c * per for c in s["compute"]], lw=0.8, ls="--", label=f"rank {r['rank']} compute")
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step")
    ax.set_title(f"wait in next() per step (stall after the first minibatch: "
                 f"{report['steady_stall_fraction']:.1%})", fontsize=10)
    if len(report["per_rank"]) <= MAX_RANKS:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ranks(report, path):
    plt = pyplot()
    rs = report["per_rank"]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.35 * len(rs)))
    labels = [f"rank {r['rank']} ({r['node']})" for r in rs]
    left = [0.0] * len(rs)
    for key, color in (("compute_s", "tab:green"), ("wait_s", "tab:red"), ("other_s", "tab:grey")):
        values = [r[key] for r in rs]
        ax.barh(labels, values, left=left, color=color, label=key[:-2])
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds of the training loop")
    ax.set_title("where each rank's time went", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def counts(report, path):
    plt = pyplot()
    rows = report.get("counts_timeline") or []
    end = max([report["wall_s"]] + [c["t"] for c in rows])
    fig, ax = plt.subplots(figsize=(10, 3.2))
    if rows:
        t = [c["t"] for c in rows] + [end]
        ax.step(t, [c["prefetchers"] * c["in_flight"] for c in rows] + [rows[-1]["prefetchers"] *
                                                                         rows[-1]["in_flight"]],
                where="post", color="tab:blue", label="requests out (prefetchers x in flight each)")
        ax.step(t, [c["readers"] for c in rows] + [rows[-1]["readers"]], where="post", color="tab:orange",
                label="readers")
        if "lookahead" in rows[-1]:
            ax.step(t, [c.get("lookahead", 0) for c in rows] + [rows[-1]["lookahead"]], where="post",
                    color="tab:green", label="look-ahead (minibatches)")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the pipeline started")
    ax.set_ylabel("count")
    ax.set_title(f"counts over the run (rank 0's node; {max(0, len(rows) - 1)} change(s))", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PLOTS = (("timeline of stage activity and stalls", "timeline.png", timeline),
         ("stall per step", "stalls.png", stalls),
         ("breakdown per rank", "ranks.png", ranks),
         ("counts over the run", "counts.png", counts))


def make_plots(report, directory):
    """Writes every plot into ``directory`` (created).

    Returns:
        ``(title, path)`` of each plot.

    Raises:
        PlotsUnavailable: matplotlib is not installed.
    """
    pyplot()
    os.makedirs(directory, exist_ok=True)
    out = []
    for title, name, draw in PLOTS:
        path = os.path.join(directory, name)
        draw(report, path)
        out.append((title, path))
    return out
