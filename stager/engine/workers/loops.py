"""Bodies of the prefetcher (stage 2) and reader (stage 3) processes.

Both loop on their pool's task queue until they receive the ``None``
sentinel, the stop event is set, or their parent dies (checked each time the
queue is idle for ``POLL_S``; a re-parented worker exits by itself, as
PyTorch's workers do). Told to stop, a worker drops the task it holds at the
next file instead of finishing and replying: nobody will read the reply.
They reply on their own pipe (``pool.py``). An exception is reported
with its stage, epoch, minibatch and file, and the worker then waits to be
stopped rather than exiting, so the report cannot be lost.
"""

import errno
import os
import pickle
import queue
import time

from .inflight import InFlight
from .. import batchfile
from .. import wire
from ..messages import Decoded, Failure, Staged
from ..perf.clock import Span
from ...decoded import DecodedTier
from ...formats import decoded_kind, make_decoder
from ...telemetry import NO_SPACE, PRESENT

POLL_S = 0.5


def _tasks(tasks, stop, parent_pid):
    while not stop.is_set() and os.getppid() == parent_pid:
        try:
            task = tasks.get(timeout=POLL_S)
        except queue.Empty:
            continue
        except (EOFError, OSError):
            return  # the queue's other end is gone with the parent: nothing left to do
        if task is None:
            return
        yield task


def _fetch(source, dst_root, index, rel, size, mtime_ns):
    """``(index, bytes fetched)``, ``(index, PRESENT)`` for a copy already there, or ``(index, NO_SPACE)``."""
    try:
        fetched = source.fetch(rel, size, mtime_ns, dst_root)
        return index, PRESENT if fetched is None else fetched
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return index, NO_SPACE  # the service makes room and retries


def prefetcher_main(worker, parent_pid, tasks, reply, stop, source, dst_root, progress=None, in_flight=None):
    """Fetches each ``StageTask``'s files into node-local storage and replies ``Staged``.

    Args:
        source: The ``Source`` to fetch from (picklable).
        dst_root: The job's node-local directory.
        progress: The service's ``stalls.Progress``, told which file this
            prefetcher waits for, so that a stalled source is noticed.
        in_flight: With ``dataset.requests_in_flight: auto``, a shared
            integer: the files each prefetcher keeps in flight now, which
            the service's tuner changes while running (at most
            ``source.concurrency``); None: ``source.concurrency``, fixed.
    """
    try:
        # The source's per-process state (a client) is made before the first task waits for it.
        getattr(source, "warm", lambda: None)()
    except Exception:
        pass  # the first fetch meets the same error and reports it with its task's context
    threads = getattr(source, "concurrency", 1)
    if threads > 1 or in_flight is not None:
        # A source with latency per file (an object store, a shared file system): several tasks' files
        # in flight at once, in threads.
        InFlight(worker, reply, stop, source, dst_root, threads, _fetch, progress, in_flight).run(
            _tasks(tasks, stop, parent_pid))
        return
    failed = False
    for task in _tasks(tasks, stop, parent_pid):
        if failed:
            continue
        span = Span().start()
        done = []
        rel = None
        try:
            for file in task.files:
                if stop.is_set():
                    return
                rel = file[1]
                if progress is not None:
                    progress.on(worker, file[0], task.epoch, task.step)
                done.append(_fetch(source, dst_root, *file))
        except Exception as exc:  # reported with its context, then we wait to be stopped
            reply.send(Failure.from_exception("prefetch", worker, exc, task.epoch, task.step, rel,
                                              f"cannot stage {source.describe(rel or '')}: "
                                              f"{type(exc).__name__}: {exc}"))
            failed = True
            continue
        finally:
            if progress is not None:
                progress.idle(worker)
        span.stop()
        reply.send(Staged(task.task, worker, done, span.wall_s, task.epoch, cpu_s=span.cpu_s,
                          queued_s=span.queued_s))


def reader_main(worker, parent_pid, tasks, reply, stop, root, loader, loader_options, rings):
    """Decodes each ``ReadTask``'s files and replies ``Decoded`` (through ``wire``).

    A sample is the decoder's output, or ``(output, label)`` for labelled
    data; a decoder with a ``collate`` callable has the minibatch's samples
    collated here, and the reply carries the result. Replies go through the reader's ``wire.Ring``, so arrays reach the
    rank through shared memory whatever their layout.

    Args:
        root: Where the task's relative paths are read from: the job's
            node-local directory, or the source's root when reading directly,
            or, for a source whose items are not files, the source itself
            (its ``open_direct`` fetches each item for the time of the read).
        loader: A ``formats.SampleDecoder`` or a loader spec (``make_decoder``);
            its ``start`` runs here once, with this reader's index and the
            number of readers, before the first sample.
        rings: One ``wire.Ring`` per reader; this one uses ``rings[worker]``.
    """
    ring = rings[worker]
    wire.widen(reply)
    tier = None
    try:
        decoder = make_decoder(loader, loader_options)
        decoder.start(worker, len(rings))
        tier = DecodedTier.open(root, decoded_kind(decoder))
        if tier is not None and not getattr(decoder, "use_decoded", lambda tier: False)(tier):
            tier.close()
            tier = None
    except Exception as exc:
        ring.send(reply, Failure.from_exception("read", worker, exc))
        decoder = None
    # A decoder that collates (a front end's ``collate_fn``) does it here, beside the decoding, as
    # DataLoader's workers do: the training process then takes the minibatch as the ring delivers it.
    collate = getattr(decoder, "collate", None)
    for task in _tasks(tasks, stop, parent_pid):
        if decoder is None:
            continue
        start = time.perf_counter()
        samples = []
        rel = None
        try:
            for index, rel, label in task.files:
                if stop.is_set():
                    return
                if isinstance(root, str):
                    sample = decoder.decode(os.path.join(root, rel), index, task.epoch)
                else:
                    with root.open_direct(rel) as path:
                        sample = decoder.decode(path, index, task.epoch)
                samples.append(sample if label is None else (sample, label))
        except Exception as exc:
            ring.send(reply, Failure.from_exception("read", worker, exc, task.epoch, task.step, rel))
            decoder = None
            continue
        published = False
        if task.publish is not None:
            try:
                # As decoded: another job of the group may collate otherwise.
                batchfile.put(task.publish, samples, time.perf_counter() - start)
                published = True
            except (OSError, pickle.PicklingError, TypeError):
                pass  # the group's shared memory is full or the samples do not travel: the others decode it
        count, out = len(samples), samples
        if collate is not None:
            try:
                out = collate(samples)
            except Exception as exc:
                ring.send(reply, Failure.from_exception(
                    "read", worker, exc, task.epoch, task.step, None,
                    f"collating minibatch {task.step} of epoch {task.epoch} ({count} samples) with {collate!r}: "
                    f"{type(exc).__name__}: {exc}"))
                decoder = None
                continue
        ring.send(reply, Decoded(task.seq, worker, out, time.perf_counter() - start, published, count,
                                 collate is not None, tier.progress() if tier is not None else None), stop)
