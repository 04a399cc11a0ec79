"""Runs ``stager analyze``: prepares the source, runs the cold, staged and synthetic phases, attributes."""

import contextlib
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import phases
from .attribution import attribute
from .steps import SimulatedStep, load_step, make_collate
from .. import plan as planlib
from ..catalog import agreed_catalog
from ..errors import ConfigError, StagerError
from ..job.source import prepare_source
from ..storage import JobDir
from ..world import detect


@dataclass(frozen=True)
class AnalyzeOptions:
    """What ``stager analyze`` measures.

    Attributes:
        step: ``module:function`` taking one minibatch; None: the simulated
            step (``run.compute_ms``).
        batches: Minibatches timed per phase (capped by the plan's first epoch).
        warmup: Untimed minibatches before them, at least 1 (start-up; the
            synthetic phase's shapes come from them).
        collate: What the step receives: ``none`` (the list of
            ``(sample, label)`` pairs) or ``torch`` (``default_collate``).
        drop_caches: Drop the page cache before the cold phase where allowed.
        progress: Say on standard error which phase runs.
    """

    step: Optional[str] = None
    batches: int = 50
    warmup: int = 2
    collate: str = "none"
    drop_caches: bool = True
    progress: bool = True

    def __post_init__(self):
        if self.batches < 1:
            raise ConfigError(f"--batches must be at least 1, not {self.batches}")
        if self.warmup < 1:
            raise ConfigError(f"--warmup must be at least 1 (start-up and the synthetic shapes), not {self.warmup}")


def drop_page_cache():
    """Writes back dirty pages and drops the clean page cache; False where that is not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("1\n")
        return True
    except OSError:  # not root, or /proc/sys read-only in a container
        return False


def _say(options, text):
    if options.progress:
        print(f"stager analyze: {text}", file=sys.stderr, flush=True)


def _measured_config(cfg):
    """The cold phase's config: one epoch, a kept staging directory of its own, no capacity.

    The staged phase reads the cold phase's copy, so every file of the timed
    minibatches must still be there: nothing may be evicted.
    """
    return cfg.replace(plan={"epochs": 1},
                       staging={"keep": True, "job_id": f"analyze-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                "capacity": None, "cache_policy": "auto", "peers": "off"})


def analyze(cfg, options):
    """Measures the three phases for ``cfg``'s job and attributes its stall.

    Args:
        cfg: A ``Config`` with staging enabled (the emulator and synthetic
            dataset sections are honoured, as by ``stager run``).
        options: ``AnalyzeOptions``.

    Returns:
        The result dictionary written by ``--json`` (see docs/analyze.md).

    Raises:
        ConfigError: For a step that cannot be loaded (checked before any
            phase runs), staging disabled, or an empty plan.
        StagerError: When started as several ranks.
    """
    step = load_step(options.step) if options.step else SimulatedStep(cfg.run.compute_ms)
    step_name = options.step or step.name
    collate = make_collate(options.collate)
    if not cfg.staging.enabled:
        raise ConfigError("stager analyze compares staging from the source with reading a local copy; "
                          "staging.enabled is false: enable it")
    world = detect("off", "none")
    if world.size > 1:
        raise StagerError(f"stager analyze runs in one process, but a launcher started {world.size} ranks "
                          f"({world.source}); run it without mpiexec, srun or torchrun")
    source = cfg.dataset.source
    with contextlib.ExitStack() as stack:
        cfg = _measured_config(prepare_source(cfg, stack, options.progress))
        catalog = agreed_catalog(None, cfg.dataset)
        available = planlib.steps_per_epoch(len(catalog), cfg.plan.batch_size, cfg.plan.drop_last)
        if available <= options.warmup:
            raise ConfigError(f"the plan's first epoch has {available} minibatch(es) of {cfg.plan.batch_size}; "
                              f"stager analyze needs more than --warmup {options.warmup}")
        count = min(options.batches, available - options.warmup)
        # Kept for the staged phase, so removed here, whatever happens.
        local = JobDir(cfg.staging, catalog.root, cfg.staging.job_id, world).path
        stack.callback(shutil.rmtree, local, True)

        dropped = drop_page_cache() if options.drop_caches else False
        _say(options, f"cold: staging from {catalog.root} ({count} minibatches timed)")
        cold = phases.cold(cfg, catalog, world, step, collate, options.warmup, count)

        _say(options, f"staged: the same minibatches from the local copy {local}")
        local_cfg = cfg.replace(dataset={"source": local}, staging={"enabled": False})
        templates = []
        staged = phases.staged(local_cfg, catalog.rooted(local), world, step, collate, options.warmup, count,
                               templates, np.random.default_rng(0))

    _say(options, "synthetic: in-memory minibatches of the same shapes")
    synthetic = phases.synthetic(templates, step, options.warmup, count)
    return {
        "method": "differential (DS-Analyzer): prep stall = staged - synthetic, fetch stall = cold - staged",
        "step": step_name,
        "page_cache_dropped": dropped,
        "settings": {"batches": count, "warmup": options.warmup, "batch_size": cfg.plan.batch_size,
                     "collate": options.collate, "samples_in_catalog": len(catalog), "source": source,
                     "loader": cfg.dataset.loader, "prefetchers": cfg.staging.prefetchers,
                     "lookahead": cfg.staging.lookahead, "readers": cfg.reader.workers},
        "phases": {p.name: p.to_dict() for p in (synthetic, staged, cold)},
        "stall": attribute(synthetic.wall_s, staged.wall_s, cold.wall_s),
    }
