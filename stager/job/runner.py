"""The job behind ``stager run``: a training-like loop over the pipeline.

It prepares the source (``source.py``: synthetic data, the emulator), iterates
the pipeline as a training loop would, optionally sleeping a simulated compute
time per step, and writes the report and the records (``records.py``).
"""

import contextlib
import sys
import time

from .progress import RunProgress
from .records import Recorder
from .source import check_outputs, prepare_source
from .state import CONTINUE, END, SIGNAL, StateFile
from .stopping import StopRequest, Stopped
from .. import plan as planlib
from ..catalog import agreed_catalog
from ..engine import Pipeline
from ..telemetry import job_summary, rank_summary, write_report
from ..world import announce_error, detect


def _loop(pipe, stop, compute_s, max_batches, recorder, bar, epochs, position, state):
    """Iterates the pipeline as a training loop would.

    Returns:
        ``(position, agreed, why)``: the position after the last minibatch
        counted; with a state file, the job's agreed position and why the
        ranks left (``state.END`` or ``state.SIGNAL``), else None, None.
    """
    batches = iter(pipe)
    steps = 0
    try:
        while not stop.requested:
            with stop.interruptible():
                batch = next(batches, None)
                if batch is None:
                    break
                if compute_s:
                    time.sleep(compute_s)  # stands in for the training step
            epochs.add(batch.epoch)
            if recorder:
                recorder.batch(batch)
            position = position.after(batch)
            bar.update()
            steps += 1
            if max_batches and pipe.stats.batches >= max_batches:
                break
            if state and steps % state.every == 0:
                agreed, why = state.agree(position, SIGNAL if stop.requested else CONTINUE)
                if why != CONTINUE:
                    return position, agreed, why
    except Stopped:
        pass  # the minibatch in hand, if any, is neither recorded nor counted
    why = SIGNAL if stop.requested else END
    if state is None:
        return position, None, why
    agreed, why = state.agree(position, why)
    return position, agreed, why


def run_job(cfg, report=None, record=None, progress=True, world=None):
    """Runs the configured job on this rank and returns the job's totals.

    Args:
        cfg: A ``Config``.
        report: Path of a JSON file for the totals (written by rank 0), or None.
        record: Directory for per-rank and per-node records, or None.
        progress: Show a progress bar (rank 0 only).
        world: A ``World``; default: detected from ``cfg.world``.

    Returns:
        On rank 0 (or without MPI), the job's totals: sums over ranks of
        batches, samples, files and bytes staged; the slowest rank's wall and
        stall seconds; and one entry per rank under ``ranks``. On other
        ranks, this rank's own summary.
    """
    world = world if world is not None else detect(cfg.world.mpi, cfg.world.backend)
    progress = progress and world.rank == 0
    check_outputs(cfg, **{"--record": record, "--report": report, "run.state_file": cfg.run.state_file})
    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress, world)
        catalog = agreed_catalog(world.comm, cfg.dataset, cfg.staging.stall_timeout_s)
        recorder = None
        if record:
            recorder = Recorder(record, catalog, world)
            stack.callback(recorder.close)
        state = StateFile(cfg.run.state_file, world, len(catalog), cfg.plan, cfg.run.state_every,
                          cfg.plan.epochs) if cfg.run.state_file else None
        start = state.load() if state else planlib.Position()
        if start != planlib.Position() and progress:
            print(f"stager: resuming from epoch {start.epoch}, {start.consumed} samples into it ({state.path})",
                  file=sys.stderr)
        steps = planlib.steps_per_epoch(len(catalog), cfg.plan.batch_size, cfg.plan.drop_last, world.size,
                                        cfg.plan.remainder)
        total = steps * (cfg.plan.epochs - start.epoch) if cfg.plan.epochs else 0
        if cfg.run.max_batches:
            total = min(total, cfg.run.max_batches) if total else cfg.run.max_batches
        # From here a stop signal is noted, and acted on at a step boundary
        # (or out of a wait): never inside the pipeline's collective start,
        # nor inside its close, which it would cut short.
        stop = stack.enter_context(StopRequest())
        pipe = stack.enter_context(Pipeline(cfg, catalog, world=world, start=start,
                                            on_staged=recorder.staged if recorder else None))
        bar = RunProgress(total, "staged run" if cfg.staging.enabled else "direct run", pipe.stats,
                          enabled=progress)
        compute_s = cfg.run.compute_ms / 1000.0
        begin = time.perf_counter()
        loop_begin = time.monotonic()
        epochs = set()
        # An error ends the job (MPI_Abort) from inside the loop; a stop (a
        # signal, max_batches, the plan's end) leaves it at a step boundary.
        try:
            position, agreed, why = _loop(pipe, stop, compute_s, cfg.run.max_batches, recorder, bar, epochs,
                                          start, state)
        except Exception as exc:
            announce_error(world, exc)  # before the pipeline's close ends the node's service for its neighbours
            raise
        loop_end = time.monotonic()
        if recorder and pipe.capacity is not None:  # a bounded cache's counters are worth a record
            recorder.cache(pipe.stats.cache_table())
        if state and world.rank == 0 and not (cfg.plan.epochs and agreed.epoch >= cfg.plan.epochs):
            print(f"stager: stopped; the job resumes from epoch {agreed.epoch}, {agreed.consumed} samples into it "
                  f"({state.path})", file=sys.stderr)
        if why == SIGNAL:  # on every rank alike, whichever was signalled: none waits in the gather below
            stop.exit()
        wall = time.perf_counter() - begin
        bar.close()
    summary = rank_summary(pipe, wall, loop_begin=loop_begin, loop_end=loop_end,
                           compute_s=compute_s * pipe.stats.batches, mode="staged" if cfg.staging.enabled else "direct",
                           epochs=len(epochs), samples_in_catalog=len(catalog))
    summary["config"] = cfg.to_dict()
    summary = job_summary(world, summary)
    if report and (world.comm is None or world.rank == 0):  # the job's report, or a rank's own without one
        write_report(report, summary)
    return summary
