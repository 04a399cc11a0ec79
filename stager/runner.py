"""The job behind ``stager run``: a training-like loop over the pipeline.

It prepares the source (creating a synthetic dataset and mounting the slow
file system emulator when the config asks), iterates the pipeline as a
training loop would, optionally sleeping a simulated compute time per step,
and writes the report and the records.
"""

import contextlib
import json
import os
import sys
import time

from . import plan as planlib
from .catalog import Catalog, broadcast_catalog
from .config import config_from_dict
from .errors import ConfigError, StagerError
from .pipeline import Pipeline
from .progress import Progress
from .slowfs import SlowFS
from .synth import MANIFEST, make_dataset
from .world import detect


def ensure_synthetic(cfg, progress=True):
    """Creates the synthetic dataset that ``cfg.synthetic`` describes, if absent.

    Returns:
        The config, with ``dataset.manifest`` set to the dataset's manifest.
    """
    syn, src = cfg.synthetic, cfg.dataset.source
    if not syn.samples:
        return cfg
    if not src:
        raise ConfigError("synthetic.samples is set but dataset.source is empty")
    manifest = os.path.join(src, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as fh:
            count = sum(1 for line in fh if line.strip())
        if count != syn.samples:
            raise ConfigError(f"{manifest} lists {count} samples but synthetic.samples is {syn.samples}; "
                              f"remove {src} to regenerate it, or set synthetic.samples={count}")
    else:
        make_dataset(src, syn.samples, syn.bytes, syn.classes, syn.seed, progress=progress)
    return cfg.replace(dataset={"manifest": MANIFEST})


def prepare_source(cfg, stack, progress=True, world=None):
    """Makes the configured source readable, mounting the emulator in ``stack`` if asked.

    Under MPI only rank 0 creates the synthetic dataset and mounts the
    emulator (a single-machine tool); the other ranks receive the result.

    Returns:
        The config whose ``dataset.source`` is where the pipeline should read.
    """
    comm = world.comm if world is not None else None
    outcome = None
    if comm is None or comm.Get_rank() == 0:
        try:
            cfg = ensure_synthetic(cfg, progress)
            if cfg.slowfs.enabled:
                mnt = stack.enter_context(SlowFS(cfg.dataset.source, open_ms=cfg.slowfs.open_ms,
                                                 mbps=cfg.slowfs.mbps, engine=cfg.slowfs.engine))
                manifest = cfg.dataset.manifest
                if manifest and os.path.isabs(manifest):
                    manifest = os.path.relpath(manifest, cfg.dataset.source)
                cfg = cfg.replace(dataset={"source": mnt, "manifest": manifest})
            outcome = ("ok", cfg.to_dict())
        except Exception as exc:
            outcome = ("error", f"{type(exc).__name__}: {exc}")
            if comm is not None:
                comm.bcast(outcome, root=0)
            raise
    if comm is None:
        return cfg
    outcome = comm.bcast(outcome, root=0)
    if outcome[0] == "error":
        raise StagerError(f"rank 0 could not prepare the dataset: {outcome[1]}")

    def leave_together(exc_type, exc, tb):
        # Rank 0 unmounts after every rank is done reading; on an error a
        # peer may never arrive, and the job is being aborted anyway.
        if exc_type is None:
            comm.Barrier()

    stack.push(leave_together)
    return config_from_dict(outcome[1])


class Recorder:
    """Writes what was read (``rank-<r>.jsonl``) and, on node leaders, what was staged
    (``staged-<node>.jsonl``)."""

    def __init__(self, directory, catalog, world):
        os.makedirs(directory, exist_ok=True)
        self.catalog = catalog
        self._reads = open(os.path.join(directory, f"rank-{world.rank}.jsonl"), "w", encoding="utf-8")
        self._staged = None
        if world.node_leader:
            self._staged = open(os.path.join(directory, f"staged-{world.node}.jsonl"), "w", encoding="utf-8")

    def batch(self, batch):
        paths = [self.catalog.path(i) for i in batch.indices]
        self._reads.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "samples": paths}) + "\n")

    def staged(self, rel, nbytes, epoch):
        self._staged.write(json.dumps({"path": rel, "bytes": nbytes, "epoch": epoch}) + "\n")

    def close(self):
        self._reads.close()
        if self._staged is not None:
            self._staged.close()


def _combine(summaries):
    """Job totals from every rank's summary (gathered on rank 0)."""
    first = summaries[0]
    total = dict(first)
    for key in ("batches", "samples", "files_staged", "bytes_staged", "files_present", "prefetch_busy_s",
                "read_busy_s", "compute_s"):
        total[key] = round(sum(s[key] for s in summaries), 4) if isinstance(first[key], float) else \
            sum(s[key] for s in summaries)
    total["wall_s"] = max(s["wall_s"] for s in summaries)
    total["stall_s"] = max(s["stall_s"] for s in summaries)  # the slowest rank sets the pace
    total["stall_fraction"] = round(total["stall_s"] / total["wall_s"], 4) if total["wall_s"] else 0.0
    total["samples_per_s"] = round(total["samples"] / total["wall_s"], 2) if total["wall_s"] else 0.0
    total["ranks"] = [{k: s[k] for k in ("rank", "node", "batches", "samples", "files_staged", "wall_s",
                                         "stall_s")} for s in summaries]
    return total


class StateFile:
    """The position a stopped run resumes from (``run.state_file``)."""

    def __init__(self, path, world, catalog, plan):
        self.path = path + (f".rank{world.rank}" if world.size > 1 else "")
        self.key = {"samples": len(catalog), "seed": plan.seed, "shuffle": plan.shuffle,
                    "batch_size": plan.batch_size, "world_size": world.size}

    def load(self):
        """Returns ``(epoch, position)`` saved by a stopped run, or ``(0, 0)``."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                state = json.load(fh)
        except FileNotFoundError:
            return (0, 0)
        except (OSError, ValueError) as exc:
            raise StagerError(f"cannot read run.state_file {self.path}: {exc}") from None
        for key, mine in self.key.items():
            if state.get(key) != mine:
                raise StagerError(f"run.state_file {self.path} was saved with {key}={state.get(key)!r}, this "
                                  f"run has {key}={mine!r}; remove it to start over")
        return (int(state["epoch"]), int(state["position"]))

    def save(self, epoch, position):
        tmp = self.path + ".part"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(dict(self.key, epoch=epoch, position=position), fh)
        os.replace(tmp, self.path)

    def remove(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def run_job(cfg, report=None, record=None, progress=True, world=None):
    """Runs the configured job on this rank and returns the job's totals.

    Args:
        cfg: A ``Config``.
        report: Path of a JSON file for the totals (written by rank 0), or None.
        record: Directory for per-rank and per-node records, or None.
        progress: Show a progress bar (rank 0 only).
        world: A ``World``; default: detected from ``cfg.world.mpi``.

    Returns:
        On rank 0 (or without MPI), the job's totals: sums over ranks of
        batches, samples, files and bytes staged; the slowest rank's wall and
        stall seconds; and one entry per rank under ``ranks``. On other
        ranks, this rank's own summary.
    """
    world = world if world is not None else detect(cfg.world.mpi)
    progress = progress and world.rank == 0
    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress, world)
        catalog = broadcast_catalog(world.comm, lambda: Catalog.load(cfg.dataset))
        recorder = None
        if record:
            recorder = Recorder(record, catalog, world)
            stack.callback(recorder.close)
        state = StateFile(cfg.run.state_file, world, catalog, cfg.plan) if cfg.run.state_file else None
        start = state.load() if state else (0, 0)
        if start != (0, 0) and progress:
            print(f"stager: resuming from epoch {start[0]}, {start[1]} samples into it ({state.path})",
                  file=sys.stderr)
        steps = planlib.steps_per_epoch(len(catalog), cfg.plan.batch_size, cfg.plan.drop_last, world.size,
                                        cfg.plan.remainder)
        total = steps * (cfg.plan.epochs - start[0]) if cfg.plan.epochs else 0
        if cfg.run.max_batches:
            total = min(total, cfg.run.max_batches) if total else cfg.run.max_batches
        pipe = stack.enter_context(Pipeline(cfg, catalog, world=world, start=start,
                                            on_staged=recorder.staged if recorder else None))
        bar = Progress(total, "staged run" if cfg.staging.enabled else "direct run", "minibatches",
                       enabled=progress)
        compute_s = cfg.run.compute_ms / 1000.0
        begin = time.perf_counter()
        epochs = set()
        position = start
        try:
            for batch in pipe:
                if compute_s:
                    time.sleep(compute_s)  # stands in for the training step
                epochs.add(batch.epoch)
                if recorder:
                    recorder.batch(batch)
                position = (batch.epoch + 1, 0) if batch.last else (batch.epoch, batch.end)
                bar.update()
                if cfg.run.max_batches and pipe.stats.batches >= cfg.run.max_batches:
                    break
        except BaseException:
            if state:  # stopped (SIGTERM, preemption, an error): the next start resumes here
                state.save(*position)
            raise
        if state:
            if cfg.run.max_batches and (not cfg.plan.epochs or position[0] < cfg.plan.epochs):
                state.save(*position)
            else:
                state.remove()
        wall = time.perf_counter() - begin
        bar.close()
    summary = {"mode": "staged" if cfg.staging.enabled else "direct", "epochs": len(epochs),
               "samples_in_catalog": len(catalog), "world_size": world.size, "nodes": world.nodes,
               "rank": world.rank, "node": world.node}
    summary.update(pipe.stats.summary(wall))
    summary["compute_s"] = round(compute_s * summary["batches"], 4)
    summary["config"] = cfg.to_dict()
    if world.comm is not None:
        gathered = world.comm.gather(summary, root=0)
        if world.rank != 0:
            return summary
        summary = _combine(gathered)
    if report:
        with open(report, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
            fh.write("\n")
    return summary
