"""The three measured phases of ``stager analyze``, each over the same number of minibatches.

Every phase runs ``warmup + count`` steps and times the last ``count``:
from the wait for the first timed minibatch to the end of the last step.
The warm-up steps absorb start-up (processes, first fetch, a step's lazy
initialisation), which ``first_s`` reports on its own.
"""

import itertools
import time
from dataclasses import dataclass, field

from .synthetic import synthetic_like
from ..engine import Pipeline


@dataclass
class PhaseResult:
    """What one phase measured over its timed minibatches.

    Attributes:
        name: ``synthetic``, ``staged`` or ``cold``.
        batches: Minibatches timed (after the warm-up).
        samples: Samples in them.
        wall_s: Seconds from the wait for the first timed minibatch to the
            end of the last step.
        wait_s: Of which waiting for minibatches (``next()`` and the collate).
        step_s: Of which in the step.
        first_s: Seconds from the phase's start to its first minibatch
            (start-up included; not in ``wall_s``).
        extra: Phase-specific counters (files staged, busy times).
    """

    name: str
    batches: int
    samples: int
    wall_s: float
    wait_s: float
    step_s: float
    first_s: float
    extra: dict = field(default_factory=dict)

    def to_dict(self):
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "name"}
        out["samples_per_s"] = round(self.samples / self.wall_s, 2) if self.wall_s > 0 else None
        return out


def measure(name, batches, step, warmup, count, started):
    """Runs ``step`` over ``warmup + count`` minibatches of ``batches`` and times the last ``count``.

    Args:
        name: The phase's name.
        batches: Iterable of ``(samples in it, what the step receives)``.
        step: The training step, called with each minibatch.
        warmup: Untimed minibatches first.
        count: Timed minibatches.
        started: ``time.perf_counter()`` when the phase began starting up.

    Returns:
        A ``PhaseResult`` (fewer timed minibatches if ``batches`` ends early).
    """
    it = iter(batches)
    wait = in_step = 0.0
    samples = timed = 0
    first = begin = None
    for i in range(warmup + count):
        t0 = time.perf_counter()
        try:
            n, batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if first is None:
            first = t1 - started
        if i == warmup:
            begin = t0
        try:
            step(batch)
        except Exception as exc:
            exc.add_note(f"(in the step, stager analyze's {name} phase, minibatch {i})")
            raise
        t2 = time.perf_counter()
        if i >= warmup:
            wait += t1 - t0
            in_step += t2 - t1
            samples += n
            timed += 1
    wall = time.perf_counter() - begin if begin is not None else 0.0
    return PhaseResult(name, timed, samples, wall, wait, in_step, first or 0.0)


def _delivered(pipe, collate, capture=None):
    """``(samples, collated batch)`` per minibatch of ``pipe``; ``capture(samples, batch)`` sees each first."""
    for batch in pipe:
        out = collate(batch.samples)
        if capture is not None:
            capture(len(batch.samples), out)
        yield len(batch.samples), out


def _counters(pipe):
    s = pipe.stats
    return {"files_staged": s.files_staged, "bytes_staged": s.bytes_staged,
            "prefetch_busy_s": round(s.prefetch_s, 4), "read_busy_s": round(s.read_s, 4)}


def cold(cfg, catalog, world, step, collate, warmup, count):
    """Phase (c): the job as configured, staging from the source (fetch-bound).

    ``cfg`` keeps the staging directory (``staging.keep``), so that the
    staged phase can read the same minibatches from it.
    """
    started = time.perf_counter()
    with Pipeline(cfg, catalog, world=world) as pipe:
        result = measure("cold", _delivered(pipe, collate), step, warmup, count, started)
        result.extra = _counters(pipe)
    return result


def staged(cfg, catalog, world, step, collate, warmup, count, templates, rng, pool=2):
    """Phase (b): the same minibatches from a complete local copy, staging off (preparation-bound).

    Args:
        cfg: The config reading the local copy with ``staging.enabled`` false.
        catalog: The catalog rooted at the local copy.
        templates: A list this phase fills with up to ``pool`` pairs
            ``(samples, synthetic minibatch)`` made from its first (warm-up)
            minibatches, for the synthetic phase.
        rng: A ``numpy.random.Generator`` for them.
        pool: How many to make (at most ``warmup``, so none costs timed time).
    """
    keep = min(pool, warmup)

    def capture(n, batch):
        if len(templates) < keep:
            templates.append((n, synthetic_like(batch, rng)))

    started = time.perf_counter()
    with Pipeline(cfg, catalog, world=world) as pipe:
        result = measure("staged", _delivered(pipe, collate, capture), step, warmup, count, started)
        result.extra = {"read_busy_s": round(pipe.stats.read_s, 4)}
    return result


def synthetic(templates, step, warmup, count):
    """Phase (a): synthetic minibatches cycled from memory, no I/O (pure compute).

    Args:
        templates: ``(samples, synthetic minibatch)`` pairs (``staged`` makes them).
    """
    started = time.perf_counter()
    return measure("synthetic", itertools.cycle(templates), step, warmup, count, started)
