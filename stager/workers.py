"""Bodies of the prefetcher (stage 2) and reader (stage 3) processes.

Both loop on a task queue until they receive the ``None`` sentinel, the stop
event is set, or their parent dies (checked each time the queue is idle for
``POLL_S``; a re-parented child exits by itself, as PyTorch's workers do).
An exception is reported to the parent with its stage, epoch, minibatch and
file, and the worker then waits to be stopped rather than exiting, so that the
report cannot be lost in a queue's buffer.
"""

import os
import queue
import signal
import time
import traceback

from .copier import stage_file
from .loaders import make_loader

POLL_S = 0.5


def _child_setup():
    # Ctrl-C reaches the whole process group; the parent alone decides how to
    # shut down, so children must not die mid-copy with a KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tasks(tasks, stop, parent_pid):
    while not stop.is_set() and os.getppid() == parent_pid:
        try:
            task = tasks.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if task is None:
            return
        yield task


def _report(events, stage, worker, epoch, step, path, exc, message=None):
    events.put(("error", stage, worker, epoch, step, path, type(exc).__name__,
                message or f"{type(exc).__name__}: {exc}", traceback.format_exc()))


def prefetcher_main(worker, parent_pid, src_root, dst_root, tasks, events, stop):
    """Copies each task's files to node-local storage and reports them staged.

    A task is ``(task, epoch, step, [(index, relpath, size), ...])``; the
    reply is ``("staged", task, worker, [(index, bytes_copied), ...], seconds, epoch)``.
    """
    _child_setup()
    failed = False
    for task, epoch, step, files in _tasks(tasks, stop, parent_pid):
        if failed:
            continue
        start = time.perf_counter()
        done = []
        rel = None
        try:
            for index, rel, size in files:
                done.append((index, stage_file(src_root, dst_root, rel, size)))
        except Exception as exc:  # reported with its context, then we wait to be stopped
            _report(events, "prefetch", worker, epoch, step, rel, exc,
                    f"cannot stage {os.path.join(src_root, rel or '')}: {type(exc).__name__}: {exc}")
            failed = True
            continue
        events.put(("staged", task, worker, done, time.perf_counter() - start, epoch))


def reader_main(worker, parent_pid, root, loader, loader_options, tasks, events, stop):
    """Decodes each task's files and sends the minibatch to the parent.

    A task is ``(seq, epoch, step, [(relpath, label_or_None), ...])``; the
    reply is ``("batch", seq, worker, samples, seconds)``, where a sample is
    the loader's output, or ``(output, label)`` for labelled data.
    """
    _child_setup()
    try:
        load = make_loader(loader, loader_options)
    except Exception as exc:
        _report(events, "read", worker, None, None, None, exc)
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
            _report(events, "read", worker, epoch, step, rel, exc)
            load = None
            continue
        events.put(("batch", seq, worker, samples, time.perf_counter() - start))
