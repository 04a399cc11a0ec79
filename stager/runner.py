"""The job behind ``stager run``: a training-like loop over the pipeline.

It prepares the source (creating a synthetic dataset and mounting the slow
file system emulator when the config asks), iterates the pipeline as a
training loop would, optionally sleeping a simulated compute time per step,
and writes the report and the records.
"""

import contextlib
import json
import os
import socket
import time

from . import plan as planlib
from .catalog import Catalog
from .errors import ConfigError
from .pipeline import Pipeline
from .progress import Progress
from .slowfs import SlowFS
from .synth import MANIFEST, make_dataset


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


def prepare_source(cfg, stack, progress=True):
    """Makes the configured source readable, mounting the emulator in ``stack`` if asked.

    Returns:
        The config whose ``dataset.source`` is where the pipeline should read.
    """
    cfg = ensure_synthetic(cfg, progress)
    if cfg.slowfs.enabled:
        mnt = stack.enter_context(SlowFS(cfg.dataset.source, open_ms=cfg.slowfs.open_ms, mbps=cfg.slowfs.mbps))
        manifest = cfg.dataset.manifest
        if manifest and os.path.isabs(manifest):
            manifest = os.path.relpath(manifest, cfg.dataset.source)
        cfg = cfg.replace(dataset={"source": mnt, "manifest": manifest})
    return cfg


class Recorder:
    """Writes what was read (``rank-<r>.jsonl``) and staged (``staged-<node>.jsonl``)."""

    def __init__(self, directory, catalog, rank=0, node=None):
        os.makedirs(directory, exist_ok=True)
        self.catalog = catalog
        node = node or socket.gethostname()
        self._reads = open(os.path.join(directory, f"rank-{rank}.jsonl"), "w", encoding="utf-8")
        self._staged = open(os.path.join(directory, f"staged-{node}.jsonl"), "w", encoding="utf-8")

    def batch(self, batch):
        paths = [self.catalog.path(i) for i in batch.indices]
        self._reads.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "samples": paths}) + "\n")

    def staged(self, rel, nbytes, epoch):
        self._staged.write(json.dumps({"path": rel, "bytes": nbytes, "epoch": epoch}) + "\n")

    def close(self):
        self._reads.close()
        self._staged.close()


def run_job(cfg, report=None, record=None, progress=True):
    """Runs the configured job and returns its totals.

    Args:
        cfg: A ``Config``.
        report: Path of a JSON file for the totals, or None.
        record: Directory for per-minibatch and per-staged-file records, or None.
        progress: Show a progress bar.

    Returns:
        A dictionary of totals (see ``Stats.summary``) plus ``epochs``, ``mode``
        and the effective config.
    """
    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress)
        catalog = Catalog.load(cfg.dataset)
        recorder = None
        if record:
            recorder = Recorder(record, catalog)
            stack.callback(recorder.close)
        steps = planlib.steps_per_epoch(len(catalog), cfg.plan.batch_size, cfg.plan.drop_last)
        total = steps * cfg.plan.epochs if cfg.plan.epochs else 0
        if cfg.run.max_batches:
            total = min(total, cfg.run.max_batches) if total else cfg.run.max_batches
        pipe = stack.enter_context(Pipeline(cfg, catalog, on_staged=recorder.staged if recorder else None))
        bar = Progress(total, "staged run" if cfg.staging.enabled else "direct run", "minibatches",
                       enabled=progress)
        compute_s = cfg.run.compute_ms / 1000.0
        begin = time.perf_counter()
        epochs = set()
        for batch in pipe:
            if compute_s:
                time.sleep(compute_s)  # stands in for the training step
            epochs.add(batch.epoch)
            if recorder:
                recorder.batch(batch)
            bar.update()
            if cfg.run.max_batches and pipe.stats.batches >= cfg.run.max_batches:
                break
        wall = time.perf_counter() - begin
        bar.close()
    summary = {"mode": "staged" if cfg.staging.enabled else "direct", "epochs": len(epochs),
               "samples_in_catalog": len(catalog)}
    summary.update(pipe.stats.summary(wall))
    summary["compute_s"] = round(compute_s * summary["batches"], 4)
    summary["config"] = cfg.to_dict()
    if report:
        with open(report, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
            fh.write("\n")
    return summary
