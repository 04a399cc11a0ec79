"""The benchmark's plots (PNG), its tables (Markdown) and the targets' check."""

import os

MARK_START = "<!-- stager bench: start -->"
MARK_END = "<!-- stager bench: end -->"


def marks(fmt):
    """The markers around a workload's block in docs/benchmarks.md (npy keeps the original ones)."""
    if fmt == "npy":
        return MARK_START, MARK_END
    return f"<!-- stager bench {fmt}: start -->", f"<!-- stager bench {fmt}: end -->"


def _cpu(row):
    cpu = row.get("cpu_s")
    if not cpu:
        return "-"
    return " / ".join(f"{cpu[kind]:.1f}" for kind in ("rank", "readers", "prefetchers", "emulator"))


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _rows(runs, method, k=None, p=None):
    return [r for r in runs if r["method"] == method and (k is None or r["readers"] == k)
            and (p is None or r["prefetchers"] == p)]


def plot_throughput(result, path):
    """Elapsed time against prefetchers, one panel per reader count."""
    plt = _plt()
    runs, ks = result["throughput"], result["settings"]["readers"]
    ps = result["settings"]["prefetchers"]
    fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 4), sharey=True, squeeze=False)
    for ax, k in zip(axes[0], ks):
        for method, style in (("stager", "o-"), ("stage-all-first", "s--")):
            rows = sorted(_rows(runs, method, k), key=lambda r: r["prefetchers"])
            ax.plot([r["prefetchers"] for r in rows], [r["wall_s"] for r in rows], style, label=method)
        rows = sorted(_rows(runs, "stager", k), key=lambda r: r["prefetchers"])
        ax.plot([r["prefetchers"] for r in rows], [r["bound_s"] for r in rows], ":", color="gray", label="bound")
        for method, color in (("direct-chainer", "tab:red"), ("direct-torch", "tab:purple"), ("ideal", "tab:green")):
            for r in _rows(runs, method, k):
                ax.axhline(r["wall_s"], color=color, linestyle="-." if method != "ideal" else ":", label=method)
        ax.set_title(f"{k} readers")
        ax.set_xlabel("prefetchers")
        ax.set_xticks(ps)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("elapsed s (lower is better)")
    axes[0][-1].legend(fontsize=8)
    s = result["settings"]
    fig.suptitle(f"{result['files']} files of {s['bytes'] // 1000} KB, {s['open_ms']:g} ms per open, "
                 f"{s['mbps']:g} MB/s")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_breakdown(result, path):
    """Training scenario: compute, waiting for data and up-front staging, stacked per method."""
    plt = _plt()
    rows = result["training"]
    names = [r["method"] for r in rows]
    compute = [min(r["compute_s"], r["wall_s"]) for r in rows]
    staging = [r["stage_s"] for r in rows]
    stall = [max(r["stall_s"] - r["stage_s"], 0.0) for r in rows]
    other = [max(r["wall_s"] - c - s - st, 0.0) for r, c, s, st in zip(rows, compute, staging, stall)]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(rows)
    for label, values in (("compute", compute), ("waiting for data", stall), ("staging up front", staging),
                          ("other", other)):
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds")
    ax.set_title(f"2 epochs, {result['settings']['compute_ms']:g} ms compute per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def speedups(result):
    """stager with the most prefetchers against the others, per reader count."""
    runs = result["throughput"]
    p = result["settings"]["train_prefetchers"]
    if p not in result["settings"]["prefetchers"]:
        p = max(result["settings"]["prefetchers"])
    out = []
    for k in result["settings"]["readers"]:
        mine = _rows(runs, "stager", k, p)
        if not mine:
            continue
        row = {"readers": k, "prefetchers": p, "stager_s": mine[0]["wall_s"], "efficiency": mine[0]["efficiency"]}
        for other in ("direct-chainer", "direct-torch", "ideal"):
            ref = _rows(runs, other, k)
            if ref:
                row[f"vs_{other}"] = round(ref[0]["wall_s"] / mine[0]["wall_s"], 2)
        first = _rows(runs, "stage-all-first", k, p)
        if first:
            row["vs_stage-all-first"] = round(first[0]["wall_s"] / mine[0]["wall_s"], 2)
        out.append(row)
    return out


def markdown(result, command, plots):
    """The tables, the plots and the command, for docs/benchmarks.md."""
    s = result["settings"]
    fmt = s.get("format", "npy")
    start, end = marks(fmt)
    decode = ("the direct loaders decode with `numpy.load`, stager's pipeline with its `npy` loader (the same "
              "arrays)" if fmt == "npy" else "every method decodes with the `image` loader to float32 "
              "channel-first arrays (Chainer's layout)")
    lines = [start, "", f"Command: `{command}`", "",
             f"{result['files']} files of {s['bytes']:,} bytes ({result['bytes'] / 1e6:.0f} MB) behind the FUSE "
             f"emulator at {s['open_ms']:g} ms per open and "
             f"{'unlimited bandwidth' if not s['mbps'] else str(s['mbps']) + ' MB/s shared'}; minibatches of "
             f"{s['batch_size']}; the emulator's {result.get('engine', '?')} engine; node-local storage on "
             f"{result.get('local_fs', '?')}. Every method reads the same order; {decode}. CPU s: the CPU "
             f"seconds of this process (rank) / reader or worker processes / prefetchers / the emulator.", "",
             "### Throughput: one epoch as fast as possible", "",
             "| method | prefetchers | readers | wall s | samples/s | bound s | efficiency | CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["throughput"]:
        lines.append(f"| {r['method']} | {r['prefetchers'] or '-'} | {r['readers']} | {r['wall_s']:.2f} | "
                     f"{r['samples_per_s']:.0f} | {r['bound_s']:.2f} | {r['efficiency']:.2f} | {_cpu(r)} |")
    lines += ["", "Speed-ups of stager at the training scenario's prefetcher count (same readers):", "",
              "| readers | prefetchers | stager s | efficiency | vs direct Chainer | vs direct PyTorch | "
              "vs stage-all-first | ideal / stager |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in speedups(result):
        lines.append(f"| {r['readers']} | {r['prefetchers']} | {r['stager_s']:.2f} | {r['efficiency']:.2f} | "
                     f"{r.get('vs_direct-chainer', '-')}x | {r.get('vs_direct-torch', '-')}x | "
                     f"{r.get('vs_stage-all-first', '-')}x | {r.get('vs_ideal', '-')} |")
    lines += ["", f"### Training: 2 epochs, {s['compute_ms']:g} ms of simulated compute per step, "
              f"{s['train_prefetchers']} prefetchers, {s['train_readers']} readers", "",
              "| method | total s | stall s | stall fraction | first minibatch s | stall after it | "
              "staging up front s | CPU s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["training"]:
        lines.append(f"| {r['method']} | {r['wall_s']:.2f} | {r['stall_s']:.2f} | {r['stall_fraction']:.1%} | "
                     f"{r['first_s']:.2f} | {r['stall_after_first_fraction']:.1%} | {r['stage_s']:.2f} | "
                     f"{_cpu(r)} |")
    lines += ["", "The first minibatch's wait is start-up (forking the workers) plus the first reads, or "
                  "the whole copy for stage-all-first; the stall after it is what overlapping hides."]
    copy = result.get("local_copy")
    if copy:
        best, key = max((v, k) for k, v in copy.items() if k.startswith("stager_"))
        p = key.split("_")[1]
        lines += ["", f"Staging from a local source without emulation: `cp -r` {copy['cp_r_files_per_s']:,.0f} "
                      f"files/s; stager staged {best:,.0f} files/s with {p} prefetchers (ratio "
                      f"{copy['best_ratio_to_cp_r']:.2f}), and its whole pipeline delivered "
                      f"{copy.get(f'pipeline_{p}_prefetchers_files_per_s', 0):,.0f} files/s to the last "
                      f"minibatch."]
    lines += [""] + [f"![{name}]({os.path.basename(path)})" for name, path in plots] + ["", end]
    return "\n".join(lines)


def update_doc(path, block, fmt="npy"):
    """Replaces the ``fmt`` workload's bench block in ``path`` (appends it when absent)."""
    start, end = marks(fmt)
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    else:
        title = "stager bench" if fmt == "npy" else f"stager bench --format {fmt}"
        text = text.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
