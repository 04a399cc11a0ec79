"""The group's staging service process: started by the first job of a group, ended by the last.

A job that finds no service runs ``names.LAUNCHER`` (``python -c``, the group's
name as argument, the founding job's setup pickled on standard input). It
claims the group's address by binding it before it imports anything of
stager, so the jobs that lose a race to start the group cost a bare
interpreter's start; the winner forks the service into a session of its
own, so that a signal aimed at the founding job does not reach it, and
prints ``ready`` (the service is listening), ``taken`` (another job's
service holds the name: attach to it) or ``error: ...``. The service then
belongs to the group: it serves every job of this user that
attaches, and when the last one has left (or none came within
``first_join_s``) it stops listening, stops its prefetchers and removes its
directories. Should it be killed, its janitors remove them, and a later
job's start removes any a reboot left behind (``storage.leftovers``).
"""

import logging
import multiprocessing
import multiprocessing.connection as mpc
import os
import pickle
import socket
import threading

from . import names
from .loop import GroupLoop
from .owned import OwnedDir
from .shelf import Shelf
from ..messages import Failure
from ..node.service import Doorway
from ..node.stalls import Progress
from .. import perf
from ..tuning import autocounts
from ..workers.loops import prefetcher_main
from ..workers.pool import Wake, WorkerPool
from ...cache import Cache, policy_name
from ...sources import open_source
from ...storage import staging_capacity
from ...storage.basedir import check_base
from ...telemetry import Stats

log = logging.getLogger(__name__)

FIRST_JOIN_S = 120.0  # a service nobody attached to by then was started by a job that died first
SHM = "/dev/shm"


class GroupService(Doorway):
    """The group's prefetchers, cache, shelf and listener, in the service process.

    Args:
        setup: The founding job's setup (``attach.join``): the group's
            name and settings, the catalog, the dataset, staging and
            processes sections, the local base directory and the look-ahead.
        sock: The listening socket on the group's address.
    """

    def __init__(self, setup, sock):
        super().__init__()
        self.name, self.settings, self.founder = setup["name"], setup["settings"], setup["founder"]
        self.catalog, self.staging = setup["catalog"], setup["staging"]
        self.shutdown_timeout_s = setup["processes"].shutdown_timeout_s
        self.first_join_s = setup.get("first_join_s", FIRST_JOIN_S)
        self._setup = setup
        self._sock = sock
        self.on_staged = self.peers = self.resizer = self.capacity = None
        self.probed = {}  # the founding job's probe's copies, once moved in (``start``)
        # The founder's probe, where the counts are ``auto``: every job that joins takes it (``Welcome``).
        self.rates = setup.get("rates")
        self.in_flight = None  # the files each prefetcher keeps in flight, shared with them, where tuned
        self.telemetry = Stats().telemetry
        self.wake = Wake()
        self.dirs = []
        self.last = []  # the last client's connection, closed once everything is removed
        self.pool = None
        self._acceptor = None

    def start(self):
        setup, staging = self._setup, self.staging
        check_base(setup["base"], setup["base_name"])
        own = names.dir_prefix(self.name) + str(os.getpid())
        data = OwnedDir(setup["base"], own)
        self.dirs.append(data)
        self.local_dir = data.path
        shelf_dir = OwnedDir(SHM, own) if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
        if shelf_dir is not None:
            self.dirs.append(shelf_dir)
        self.shelf = Shelf(shelf_dir.path if shelf_dir else data.path, staging.share_window)
        files = self.catalog.files
        self.capacity, self.ahead, window, note = staging_capacity(staging, self.local_dir, files.sizes,
                                                                   setup["batch_size"], setup["ahead"],
                                                                   setup["ranks"], setup["most"])
        if note:
            log.info("stager: %s", note)
        self.cache = Cache(files.sizes, policy_name(staging.cache_policy, self.capacity), self.capacity, window,
                           self.catalog.file_index)
        tuned = setup.get("in_flight")
        self.source = open_source(self.catalog.root, setup["dataset"], staging.verify,
                                  perf.MAX_IN_FLIGHT if tuned else None)
        getattr(self.source, "warm", lambda: None)()
        self.probed = _move_in(setup.get("probe_dir"), setup.get("probed") or {}, files, self.local_dir)
        ctx = multiprocessing.get_context(setup["processes"].start_method)
        most = getattr(self.source, "concurrency", 1)
        auto = None
        if self.rates is not None and setup.get("auto_fetch"):  # the pool follows the group's demand, as a job's
            auto = autocounts.AutoFetch.of(perf.Rates.from_dict(self.rates), tuned, most)
        self.progress = Progress(ctx, max(staging.prefetchers, auto.limit if auto else 0), most)
        self.in_flight = ctx.Value("i", tuned, lock=False) if tuned else None
        self.pool = WorkerPool(ctx, "prefetch", "stager-prefetch", staging.prefetchers, prefetcher_main,
                               (self.source, self.local_dir, self.progress, self.in_flight),
                               {d.janitor.fileno() for d in self.dirs})
        if auto is not None:
            self.resizer = auto.resizer(self.pool, self.telemetry, self.in_flight, most)
        self._acceptor = threading.Thread(target=self._accept, name="stager-accept", daemon=True)
        self._acceptor.start()

    def counts(self):
        """``(prefetchers, files each keeps in flight or None)`` now."""
        return self.pool.size, None if self.in_flight is None else self.in_flight.value

    def _accept(self):
        uid = os.getuid()
        while not self._halt.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                if self._halt.is_set():
                    return
                continue
            if self._halt.is_set() or names.socket_uid(sock) != uid:
                sock.close()  # the group is this user's alone
                continue
            sock.setblocking(True)
            self._incoming.put(mpc.Connection(sock.detach()))
            self.wake.notify()

    def run(self):
        loop = GroupLoop(self)
        try:
            loop.run()
        except BaseException as exc:
            log.exception("stager: the group's staging service failed")
            loop.fail(Failure.from_exception("prefetch", "group service", exc,
                                             message=f"staging.share {self.name!r}: the group's staging service "
                                                     f"failed: {type(exc).__name__}: {exc}"))
        finally:
            for conn in loop.clients:
                conn.close()

    def close(self):
        """Stops listening first (a job arriving now starts a new service), then everything else."""
        self._halt.set()
        if self._acceptor is not None and self._acceptor.is_alive():
            try:  # unblocks accept(); it sees the halt flag
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as knock:
                    knock.connect(self._sock.getsockname())
            except OSError:
                pass
            self._acceptor.join(timeout=self.shutdown_timeout_s)
        self._sock.close()
        for conn in self.accepted():
            conn.close()  # arrived too late: it sees end-of-file and starts a new service
        stuck = self.pool.stop(self.shutdown_timeout_s) if self.pool is not None else []
        self.wake.close()
        for d in self.dirs:
            d.remove(stuck)
        for conn in self.last:
            conn.close()


def _move_in(probe_dir, probed, files, local_dir):
    """Moves the founding job's probe's copies into the group's directory: ``{file index: bytes}`` moved.

    Both directories are under the same base, so each is a rename; a copy
    that cannot be moved is fetched again by a prefetcher, as any other.
    """
    moved = {}
    if not probe_dir:
        return moved
    for file, nbytes in probed.items():
        rel = files.path(file)
        target = os.path.join(local_dir, rel)
        try:
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            os.rename(os.path.join(probe_dir, rel), target)
        except OSError:
            continue
        moved[file] = nbytes
    return moved


def serve(sock, setup, ready_fd):
    """The service's life on its bound socket; says ``ready`` or ``error: ...`` on ``ready_fd``.

    Returns:
        The process's exit code.
    """
    def tell(text):
        os.write(ready_fd, text.encode())
        os.close(ready_fd)

    service = None
    try:
        service = GroupService(pickle.loads(setup), sock)
        service.start()
    except BaseException as exc:
        tell(f"error: {type(exc).__name__}: {exc}")
        if service is not None:
            service.close()
        return 1
    tell("ready")
    try:
        service.run()
    finally:
        service.close()
    return 0
