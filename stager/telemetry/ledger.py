"""The CPU ledger: what each epoch cost a sample, by process kind (``EPOCH_CPU`` events).

A rank marks the CPU seconds spent so far by its training process, its
readers and (on a node's leader) the node's prefetchers when its pipeline
starts and at each epoch's end (``engine.rank.cpuledger``). The
differences, over the samples each epoch delivered, say where a staged
epoch 1's CPU went against the epochs that read the copies: the report's
``cpu_by_epoch`` and ``stager report``'s ledger.
"""

RANK, READERS, PREFETCHERS, SAMPLES = range(4)  # an ``EPOCH_CPU`` event's ``b``
KINDS = ("rank", "readers", "prefetchers")
BEFORE = -1  # the ``a`` of the mark made as the pipeline starts


def by_epoch(events):
    """Each epoch's CPU milliseconds a sample, by kind, from a rank's ``EPOCH_CPU`` events.

    Args:
        events: ``(epoch, kind, value)`` of the ``EPOCH_CPU`` events, in order.

    Returns:
        ``[{"epoch", "samples", "rank_s", "readers_s", "prefetchers_s"}]``:
        seconds each kind spent from the previous mark (the pipeline's start
        for the first) to the epoch's.
    """
    marks = {}
    for epoch, kind, value in events:
        marks.setdefault(epoch, {})[kind] = value
    rows, last = [], marks.pop(BEFORE, None)
    for epoch in sorted(marks):
        now = marks[epoch]
        if last is not None and all(k in now for k in range(4)):
            row = {"epoch": int(epoch), "samples": int(now[SAMPLES])}
            row.update({f"{name}_s": round(max(now[k] - last[k], 0.0), 4) for k, name in enumerate(KINDS)})
            rows.append(row)
        last = now
    return rows


def ledger_lines(rows):
    """The ledger as text lines: each epoch's CPU milliseconds a sample by kind; [] without rows."""
    rows = [r for r in rows if r["samples"]]
    if not rows:
        return []
    lines = ["", "CPU a sample, by epoch (ms; from each process's own clocks):"]
    header = ("epoch", "samples", "training", "readers", "prefetchers", "all")
    table = []
    for r in rows:
        ms = [r[f"{name}_s"] / r["samples"] * 1e3 for name in KINDS]
        table.append((r["epoch"], r["samples"], *(f"{x:.2f}" for x in ms), f"{sum(ms):.2f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    lines += ["  " + fmt.format(*header)] + ["  " + fmt.format(*row) for row in table]
    return lines
