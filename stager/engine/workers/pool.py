"""Worker processes and the channels a scheduling thread waits on.

A pool of worker processes has one shared task queue and one reply pipe each.

Each worker replies on a pipe whose write end only that worker holds. A
worker that dies while sending (killed by the OOM killer, say) therefore
shows up as end-of-file on its own pipe, never as half a message that would
block the reader forever, as it could on a queue shared by all workers.

Forked workers close every file descriptor that was open in the parent
when they were started, except standard input, output and error, the task
queue and their own pipe (as ``subprocess`` does with ``close_fds``); the
pipe that tells ``multiprocessing`` the worker is alive is made during the
start and stays. So a worker never keeps another pool's pipe, a peer's
socket or a janitor's pipe open: when their owner dies the other ends see
end-of-file at once. A loader must therefore open its files itself, which it
does with the paths it is given.
"""

import contextlib
import ctypes
import logging
import multiprocessing
import os
import threading
import time

from .forksafe import held_while_forking, sigterm_noted, worker_signals
from ..messages import worker_died

log = logging.getLogger(__name__)


@contextlib.contextmanager
def children_skip_mpi(start_method):
    """Children started inside the block never initialise MPI.

    A spawned child re-imports ``__main__``; if that imports ``mpi4py.MPI``,
    the child would initialise MPI and crash (MPICH) or hang (Open MPI).
    Only the children see the variable: it is restored once they exist.
    """
    if start_method == "fork":
        yield
        return
    old = os.environ.get("MPI4PY_RC_INITIALIZE")
    os.environ["MPI4PY_RC_INITIALIZE"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MPI4PY_RC_INITIALIZE"]
        else:
            os.environ["MPI4PY_RC_INITIALIZE"] = old


def _open_fds():
    return {int(name) for name in os.listdir("/proc/self/fd")}


def _name_process(name):
    # The kernel's name shows in top, ps -o comm and py-spy, where every
    # worker would otherwise be "python"; it is cut to 15 bytes.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass  # not Linux: the name is cosmetic


def _entry(target, index, writers, tasks, stop, parent, start_method, inherited, args):
    mine = writers[index]
    worker_signals()
    _name_process(multiprocessing.current_process().name)
    if start_method == "fork":
        for fd in inherited - {0, 1, 2, mine.fileno(), tasks._reader.fileno()}:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already
    else:
        for j, writer in enumerate(writers):
            if j != index and writer is not None:  # a pool grown later hands over only its own
                writer.close()
    try:
        target(index, parent, tasks, mine, stop, *args)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        if not stop.is_set() and os.getppid() == parent:
            raise
        # Told to stop, or orphaned (the owner was killed): the owner closed
        # its end and the reply is moot; exit quietly, without a traceback.


def _join_all(procs, timeout_s):
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))


class WorkerPool:
    """Starts ``count`` processes running ``target(index, parent_pid, tasks, reply, stop, *args)``.

    Args:
        ctx: A multiprocessing context.
        stage: The stage the workers serve (``prefetch``, ``read``), named in
            the failure of a worker that dies.
        name: Process name prefix, e.g. ``stager-read``.
        count: Number of workers.
        target: The worker body.
        args: Extra arguments for ``target``.
        keep_fds: Inherited descriptors forked workers keep open (a janitor's
            pipe, so that it waits for them too).
        recv: How a reply is read: ``recv(index, conn)`` for worker
            ``index``'s pipe (default ``conn.recv()``; readers use their
            ``wire.Ring``).
        owned: Objects the pool closes once its workers are gone (the
            readers' rings).
    """

    def __init__(self, ctx, stage, name, count, target, args, keep_fds=(), recv=None, owned=()):
        self.stage = stage
        self._start_args = (ctx, name, target, args, list(keep_fds))  # for grow()
        self._retiring = 0
        self._next_index = count
        self.retired = 0
        self._owned = list(owned)
        self._recv = recv or (lambda index, conn: conn.recv())
        self.tasks = ctx.Queue()
        self.stop_event = ctx.Event()
        pipes = [ctx.Pipe(duplex=False) for _ in range(count)]
        self.conns = [reader for reader, _ in pipes]
        writers = [writer for _, writer in pipes]
        self.procs = []
        fork = ctx.get_start_method() == "fork"
        try:
            # A SIGTERM meanwhile is raised here, once the workers exist; a worker takes a signal only
            # once it has set its own handlers.
            with sigterm_noted(), held_while_forking():
                for i in range(count):
                    proc = ctx.Process(target=_entry, name=f"{name}-{i}", daemon=True,
                                       args=(target, i, writers, self.tasks, self.stop_event, os.getpid(),
                                             ctx.get_start_method(), _open_fds() - set(keep_fds) if fork else set(),
                                             args))
                    proc.start()
                    self.procs.append(proc)
        except BaseException:
            # Nobody will hold this pool to stop it: its workers end here.
            for proc in self.procs:
                proc.terminate()
            _join_all(self.procs, 5.0)
            raise
        finally:
            for writer in writers:
                writer.close()  # the parent keeps only the read ends
        self.by_conn = {conn: (i, proc) for i, (conn, proc) in enumerate(zip(self.conns, self.procs))}

    def receive(self, conn):
        """The next reply on ``conn``, or the ``Failure`` of a worker that died without one.

        A worker's pipe reaches end-of-file only when the worker is gone (it
        alone holds the write end), so EOF here is a death, never a lost
        message; the caller stops waiting on ``conn``.
        """
        index, proc = self.by_conn[conn]
        try:
            return self._recv(index, conn)
        except (EOFError, OSError):
            proc.join(1.0)
            if self._retiring and proc.exitcode == 0:
                return self._retire(conn, proc)
            return worker_died(self.stage, proc)

    def stop(self, timeout_s):
        """Stops the workers: event, one ``None`` sentinel each, close the
        reply pipes, join, then terminate, then kill. Safe to call twice.

        Workers drop what they hold: they check the event between files (and
        readers between the arrays they copy out), and closing the read ends
        turns a reply half written into a full pipe into ``BrokenPipeError``
        at once (which ``_entry`` takes as the end), so nothing is drained and a
        normal stop takes about one file's decoding, not the time to read
        every worker's minibatch.

        Never waits longer than ``timeout_s`` + 6 s, however many workers are
        late: a worker that survives SIGKILL (asleep in the kernel on a hung
        file system, state D) is reported and left; it exits when the kernel
        lets it.

        Returns:
            The pids of workers left running that way (usually none).
        """
        if not self.procs:
            return []
        self.stop_event.set()
        for _ in self.procs:
            self.tasks.put(None)
        for conn in self.conns:
            conn.close()
        _join_all(self.procs, timeout_s)
        # Every late worker is signalled before any is waited for, so sixteen
        # workers stuck in the kernel take no longer to give up on than one.
        late = [proc for proc in self.procs if proc.is_alive()]
        for proc in late:
            log.warning("stager: %s (pid %s) did not stop in time; terminating", proc.name, proc.pid)
            proc.terminate()
        _join_all(late, 1.0)
        late = [proc for proc in late if proc.is_alive()]
        for proc in late:
            proc.kill()
        _join_all(late, 5.0)
        stuck = []
        for proc in self.procs:
            if proc.is_alive():
                log.error("stager: %s (pid %s) survives SIGKILL (stuck in the kernel, e.g. on a hung "
                          "file system); leaving it: it ends when its file system answers or is "
                          "unmounted by force", proc.name, proc.pid)
                stuck.append(proc.pid)
                # multiprocessing joins its children, without a timeout, at
                # interpreter exit: this one would hold the exit forever.
                multiprocessing.process._children.discard(proc)
        for thing in self._owned:
            thing.close()
        self.tasks.cancel_join_thread()  # nobody will read what is left
        self.tasks.close()
        self.procs = []
        return stuck


    # Resizing (``auto`` counts) ---------------------------------------------

    @property
    def size(self):
        """Workers that will go on taking tasks (running, less those told to retire)."""
        return len(self.procs) - self._retiring

    def grow(self, count, keep_fds=(), owned=()):
        """Starts ``count`` more workers on the same task queue.

        A new worker's index follows every index used so far, so a target
        that keeps per-worker state by index (a reader's ``rings[worker]``)
        must have appended it before the call; its descriptors go in
        ``keep_fds`` and the objects the pool closes at the end in ``owned``.
        The caller adds the new ``conns`` to what it waits on.

        Returns:
            The new workers' reply connections.
        """
        ctx, name, target, args, keep = self._start_args
        keep.extend(keep_fds)
        self._owned.extend(owned)
        fork = ctx.get_start_method() == "fork"
        new = []
        for _ in range(count):
            index = self._next_index
            self._next_index += 1
            reader, writer = ctx.Pipe(duplex=False)
            writers = [None] * index + [writer]
            try:
                proc = ctx.Process(target=_entry, name=f"{name}-{index}", daemon=True,
                                   args=(target, index, writers, self.tasks, self.stop_event, os.getpid(),
                                         ctx.get_start_method(), _open_fds() - set(keep) if fork else set(),
                                         args))
                with held_while_forking():
                    proc.start()
            except BaseException:
                reader.close()
                raise
            finally:
                writer.close()
            self.conns.append(reader)
            self.procs.append(proc)
            self.by_conn[reader] = (index, proc)
            new.append(reader)
        return new

    def shrink(self, count):
        """Tells ``count`` workers to leave once the tasks queued before now are taken.

        One ``None`` per worker goes on the shared queue behind the tasks
        already there, so no task is lost: whichever worker takes a ``None``
        has replied for everything it took before, and its pipe's end-of-file
        is then read by ``receive`` as a retirement, not a death. At least
        one worker always stays.
        """
        count = max(0, min(count, self.size - 1))
        self._retiring += count
        for _ in range(count):
            self.tasks.put(None)
        return count

    def _retire(self, conn, proc):
        self._retiring -= 1
        self.retired += 1
        self.procs.remove(proc)
        self.conns.remove(conn)
        del self.by_conn[conn]
        conn.close()
        return RETIRED


RETIRED = object()  # what ``receive`` returns for a worker that left after ``shrink``: stop waiting on it


class Wake:
    """A pipe that wakes a thread waiting in ``multiprocessing.connection.wait``.

    Other threads ``notify`` it with a message; the waiting thread includes
    ``conn`` among the objects it waits on and ``recv``s from it. Closing it
    makes later notices return False instead of raising.
    """

    def __init__(self):
        self.conn, self._send_end = multiprocessing.Pipe(duplex=False)
        self._lock = threading.Lock()

    def notify(self, msg=None):
        """Sends ``msg`` to the waiting thread; False once the channel is closed."""
        with self._lock:
            try:
                self._send_end.send(msg)
                return True
            except (OSError, ValueError):
                return False

    def recv(self):
        """The next notice (in the waiting thread)."""
        return self.conn.recv()

    def close(self):
        """Closes both ends; safe to call twice."""
        with self._lock:
            self.conn.close()
            self._send_end.close()

