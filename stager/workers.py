"""Bodies of the prefetcher (stage 2) and reader (stage 3) processes.

Both loop on their pool's task queue until they receive the ``None``
sentinel, the stop event is set, or their parent dies (checked each time the
queue is idle for ``POLL_S``; a re-parented worker exits by itself, as
PyTorch's workers do). They reply on their own pipe (``workerpool.py``). An
exception is reported with its stage, epoch, minibatch and file, and the
worker then waits to be stopped rather than exiting, so the report cannot be
lost.
"""

import os
import queue
import time
import traceback

from . import wire
from .copier import stage_file
from .loaders import make_loader

POLL_S = 0.5


def _tasks(tasks, stop, parent_pid):
    while not stop.is_set() and os.getppid() == parent_pid:
        try:
            task = tasks.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if task is None:
            return
        yield task


def error_message(stage, worker, epoch, step, path, exc, message=None):
    """The tuple a worker sends for an exception (see ``StageError``)."""
    return ("error", stage, worker, epoch, step, path, type(exc).__name__,
            message or f"{type(exc).__name__}: {exc}", traceback.format_exc())


def prefetcher_main(worker, parent_pid, tasks, reply, stop, src_root, dst_root):
    """Copies each task's files to node-local storage and reports them staged.

    A task is ``(task, epoch, step, [(index, relpath, size, mtime_ns), ...])``;
    the reply is ``("staged", task, worker, [(index, bytes_copied), ...], seconds, epoch)``.
    """
    failed = False
    for task, epoch, step, files in _tasks(tasks, stop, parent_pid):
        if failed:
            continue
        start = time.perf_counter()
        done = []
        rel = None
        try:
            for index, rel, size, mtime_ns in files:
                done.append((index, stage_file(src_root, dst_root, rel, size, mtime_ns)))
        except Exception as exc:  # reported with its context, then we wait to be stopped
            reply.send(error_message("prefetch", worker, epoch, step, rel, exc,
                                     f"cannot stage {os.path.join(src_root, rel or '')}: "
                                     f"{type(exc).__name__}: {exc}"))
            failed = True
            continue
        reply.send(("staged", task, worker, done, time.perf_counter() - start, epoch))


def reader_main(worker, parent_pid, tasks, reply, stop, root, loader, loader_options):
    """Decodes each task's files and sends the minibatch to the parent.

    A task is ``(seq, epoch, step, [(relpath, label_or_None), ...])``; the
    reply is ``("batch", seq, worker, samples, seconds)``, where a sample is
    the loader's output, or ``(output, label)`` for labelled data. Replies
    go through ``wire`` so that arrays cross the pipe without extra copies.
    """
    wire.widen(reply)
    try:
        load = make_loader(loader, loader_options)
    except Exception as exc:
        wire.send(reply, error_message("read", worker, None, None, None, exc))
        load = None
    for seq, epoch, step, files in _tasks(tasks, stop, parent_pid):
        if load is None:
            continue
        start = time.perf_counter()
        samples = []
        rel = None
        try:
            for rel, label in files:
                sample = load(os.path.join(root, rel))
                samples.append(sample if label is None else (sample, label))
        except Exception as exc:
            wire.send(reply, error_message("read", worker, epoch, step, rel, exc))
            load = None
            continue
        wire.send(reply, ("batch", seq, worker, samples, time.perf_counter() - start))
