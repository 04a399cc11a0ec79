"""One picture of where stager stands: each epoch's seconds of the loaders users compare it with, from saved runs.

    .venv/bin/python benchmarks/loaders/overview.py      # docs/bench-overview.png from docs/peers-side-overview.json, docs/dali-1536.json

The two runs it reads (2026-12-07):

    /tmp/peers/bin/python benchmarks/loaders/peers_side.py --processes 4 --rounds 2 \
        --methods dataloader,stager,streaming,litdata --json docs/peers-side-overview.json
    .venv/bin/python benchmarks/loaders/dali_side.py --samples 1536 --open-ms 10 --threads 4 --json docs/dali-1536.json

Both runs read the same set: 1,536 JPEGs of 256x256 (115 KB) behind the
emulator at 10 ms an open, batch 32, shuffled, 3 epochs, no compute, with
``--processes`` loading processes (DALI: as many threads). From
``peers_side.py`` (medians of its rounds): ``DataLoader``, MosaicML Streaming
and LitData (their conversions apart, printed beside), and the one-line
``StagedLoader``, all with torchvision's training transforms. From
``dali_side.py``: a DALI CPU pipeline (random-crop decode, resize,
normalise, mirror) over DALI's ``fn.readers.file`` and over the one line
changed, ``iterators.dali.reader``. stager's rows are on its defaults.
"""

import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, source, method) in the order drawn; stager's own in its colour.
LOADERS = (("DataLoader", "peers", "dataloader"), ("MosaicML Streaming", "peers", "streaming"),
           ("LitData", "peers", "litdata"), ("DALI fn.readers.file", "dali", "dali"),
           ("stager: StagedLoader", "peers", "stager"), ("stager: DALI reader", "dali", "stager"))


def epochs_of(peers, dali, n):
    """``{label: [median seconds of each epoch]}`` and the conversions' seconds, for ``n`` processes."""
    row = peers["rows"][str(n)]
    [dali_row] = [r for r in dali["rows"] if r["threads"] == n]
    out = {}
    for label, where, method in LOADERS:
        if where == "peers":
            runs = row["results"][method]
            out[label] = [statistics.median(r["epochs"][e] for r in runs) for e in range(len(runs[0]["epochs"]))]
        else:
            out[label] = list(dali_row[method]["epochs"])
    return out, row["conversions"]


def draw(epochs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(epochs)
    count = len(next(iter(epochs.values())))
    width = 0.8 / count
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for e in range(count):
        xs = [i + (e - (count - 1) / 2) * width for i in range(len(labels))]
        bars = ax.bar(xs, [epochs[label][e] for label in labels], width, label=f"epoch {e + 1}",
                      color=["#4c72b0", "#55a868", "#c44e52"][e % 3], alpha=[1.0, 0.75, 0.5][e % 3])
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    ax.set_xticks(range(len(labels)), [label.replace(": ", ":\n") for label in labels], fontsize=8)
    for tick in ax.get_xticklabels():
        if tick.get_text().startswith("stager"):
            tick.set_fontweight("bold")
    ax.set_ylabel("seconds an epoch (lower is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=os.path.join(REPO, "docs", "peers-side-overview.json"))
    parser.add_argument("--dali", default=os.path.join(REPO, "docs", "dali-1536.json"))
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "bench-overview.png"))
    args = parser.parse_args()
    with open(args.peers) as fh:
        peers = json.load(fh)
    with open(args.dali) as fh:
        dali = json.load(fh)
    if (peers["samples"], peers["open_ms"]) != (dali["samples"], dali["rows"][0]["open_ms"]):
        sys.exit(f"the two runs read different sets: {peers['samples']} files at {peers['open_ms']} ms against "
                 f"{dali['samples']} at {dali['rows'][0]['open_ms']} ms")
    epochs, conversions = epochs_of(peers, dali, args.processes)
    draw(epochs, args.out, f"{peers['samples']} JPEGs behind the emulator at {peers['open_ms']:g} ms an open, "
                           f"{args.processes} loading processes (DALI: threads), 3 epochs, 2 cores; "
                           "stager on its defaults")
    print("| loader | " + " | ".join(f"epoch {e + 1} s" for e in range(len(epochs["DataLoader"]))) + " |")
    print("|---|" + "---:|" * len(epochs["DataLoader"]))
    for label, seconds in epochs.items():
        print(f"| {label} | " + " | ".join(f"{s:.2f}" for s in seconds) + " |")
    print(f"\nconversions before the first epoch: Streaming {conversions['streaming']:.1f} s, "
          f"LitData {conversions['litdata']:.1f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
