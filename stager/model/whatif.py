"""``stager whatif``: the model's predictions over a grid of settings, as a table.

A calibration is a ``Rates`` saved as JSON: made by a probe of a config's
source (and refined by a run's ``--report``), or read back. Each row of the
grid changes some of: prefetchers, readers, latency per open, bandwidth,
compute per step, and the cache's capacity (whose misses come from replaying
the config's plan, so a capacity needs the config).
"""

import contextlib
import itertools
import json
from dataclasses import dataclass, replace
from typing import Union

from .calibrate import available_cores, from_summary
from .misses import step_misses
from .. import plan as planlib
from ..cache import parse_capacity
from ..engine.perf import Rates, Settings, choose_counts, predict, predict_run, probe
from ..errors import ConfigError


@dataclass(frozen=True)
class Row:
    """One setting and its prediction."""

    prefetchers: Union[int, str]  # a count, or "auto (N)"
    readers: int
    open_ms: float
    mbps: float
    compute_ms: float
    capacity: str
    samples_per_s: float
    stall: float
    bottleneck: str


def load_rates(path):
    """A calibration saved by ``save_rates``; a clear error for a bad file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return Rates.from_dict(json.load(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read calibration {path}: {exc.strerror}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not a stager calibration: {exc}") from None


def save_rates(rates, path):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(rates.to_dict(), fh, indent=2)
        fh.write("\n")


@contextlib.contextmanager
def calibrated(cfg, report=None, compute_ms=None):
    """Probes ``cfg``'s source (mounting the emulator when the config asks) and yields ``(rates, catalog, cfg)``.

    Args:
        cfg: A ``Config``.
        report: A run's ``--report`` JSON path whose totals refine the stages' costs.
        compute_ms: The training step's time; default: the report's, else ``run.compute_ms``.
    """
    from ..catalog import load_catalog
    from ..job.source import prepare_source
    from ..sources import open_source

    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress=False)
        catalog = load_catalog(cfg.dataset)
        source = open_source(catalog.root, cfg.dataset)
        compute_s = (compute_ms if compute_ms is not None else cfg.run.compute_ms) / 1000.0
        rates = probe(source, catalog, cfg.dataset.loader,
                      {"hdf5_key": cfg.dataset.hdf5_key, "layout": cfg.dataset.layout},
                      batch_size=cfg.plan.batch_size, compute_s=compute_s)
        if not report:
            # The probe's costs are its quickest (no wait for a core in them): the cores are
            # those the machine gives now (all of them when quiet). A run's costs are wall
            # times that include such waits, so with a report the cores stay the machine's.
            rates = replace(rates, cores=round(available_cores(), 2))
        if report:
            try:
                with open(report, encoding="utf-8") as fh:
                    summary = json.load(fh)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read run report {report}: {exc}") from None
            rates = from_summary(summary, rates)
            if compute_ms is not None:
                rates = Rates.from_dict({**rates.to_dict(), "compute_s": compute_s})
        yield rates, catalog, cfg


def capacity_bytes(text, sizes):
    """A capacity in bytes: ``500M`` as ``staging.capacity`` reads it, but ``50%`` of the dataset's bytes."""
    parsed = parse_capacity(text)
    if parsed is None:
        return None
    kind, value = parsed
    return value if kind == "bytes" else int(value * int(sizes.sum()))


def auto_prefetchers(rates, settings):
    """The prefetchers ``auto`` settles at on the source of ``settings`` (its latency and bandwidth).

    The count its tuner reaches at a steady pace: Little's law at the rate
    the rest of the pipeline allows there (``perf.choose_counts`` on rates
    with that source), within the source's limit at that time per file.
    """
    at = replace(rates, open_s=rates.open_s if settings.open_s is None else settings.open_s,
                 bandwidth=rates.bandwidth if settings.bandwidth is None else settings.bandwidth)
    return choose_counts(at)[0]


def grid(rates, prefetchers, readers, open_ms=(None,), mbps=(None,), compute_ms=(None,), capacities=(None,),
         catalog=None, plan_cfg=None, ahead=16):
    """Predictions for every combination of the given values (None: the calibration's).

    Args:
        rates: A ``Rates``.
        prefetchers, readers: Counts to try; ``auto`` among the prefetchers
            is the count ``auto`` settles at for each source tried (the
            tuner's Little's law at that latency and bandwidth, within the
            source's limit), shown as ``auto (N)``.
        open_ms, mbps, compute_ms: Source and compute values to try.
        capacities: Capacities to try (``capacity_bytes``; None: unbounded).
        catalog, plan_cfg: The catalog and ``PlanConfig``, needed for capacities.
        ahead: Minibatches asked for ahead (``staging.lookahead``).

    Returns:
        A list of ``Row``.
    """
    misses = {}
    if catalog is not None and plan_cfg is not None:
        spec = planlib.PlanSpec.from_config(len(catalog), plan_cfg, 1, containers=catalog.containers)
        sizes = catalog.files.sizes  # what the cache holds: files, or the containers samples are packed in
        for cap in capacities:
            misses[cap] = step_misses(sizes, spec, capacity=capacity_bytes(cap, sizes), ahead=ahead,
                                      to_files=catalog.file_index)
    elif any(c is not None for c in capacities):
        raise ConfigError("stager whatif: --capacity needs --config (the cache's misses are computed from the plan)")
    rows = []
    for p, r, o, m, c, cap in itertools.product(prefetchers, readers, open_ms, mbps, compute_ms, capacities):
        settings = Settings(prefetchers=p, readers=r, open_s=None if o is None else o / 1000.0,
                            bandwidth=None if m is None else m * 1e6, compute_s=None if c is None else c / 1000.0)
        label = p
        if p == "auto":
            p = auto_prefetchers(rates, settings)
            settings, label = replace(settings, prefetchers=p), f"auto ({p})"
        if cap in misses:
            rate, stall, _ = predict_run(rates, settings, misses[cap], ahead)
            worst = max(e.sum() / (len(e) * rates.batch_size) for e in misses[cap] if len(e))
            bottleneck = predict(rates, replace(settings, miss=worst)).bottleneck
        else:
            pred = predict(rates, settings)
            rate, stall, bottleneck = pred.samples_per_s, pred.stall, pred.bottleneck
        rows.append(Row(label, r, rates.open_s * 1000 if o is None else o,
                        rates.bandwidth / 1e6 if m is None else m,
                        rates.compute_s * 1000 if c is None else c, cap or "unbounded", rate, stall, bottleneck))
    return rows


def markdown(rows):
    """The rows as a Markdown table."""
    out = ["| prefetchers | readers | open ms | MB/s | compute ms | capacity | samples/s | stall | bottleneck |",
           "|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        mbps = f"{r.mbps:.0f}" if r.mbps else "unlimited"
        out.append(f"| {r.prefetchers} | {r.readers} | {r.open_ms:.1f} | {mbps} | {r.compute_ms:.0f} | {r.capacity} "
                   f"| {r.samples_per_s:.0f} | {r.stall:.0%} | {r.bottleneck} |")
    return "\n".join(out)
