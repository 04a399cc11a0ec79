"""The node's staging service: one pool of prefetchers shared by the node's ranks.

The node leader (local rank 0) owns the job's staging directory, the
prefetcher processes and a service thread. Every rank of the node, the leader
included, is a client: it asks for each of its upcoming minibatches
(``Need``) and is told when all their files are local (``Ready``); it says
when it has read one (``Release``), so the node's cache knows which files are
still needed. The service copies a file at
most once however many ranks or epochs need it, and serves requests in
arrival order, so the node's prefetch capacity is shared and one rank's heavy
minibatch does not hold back its neighbours' for long.

The leader's own pipeline talks to the service over a pipe; the other ranks
of the node connect over a Unix socket in the (0700) job directory, with a
random key handed out by MPI, whenever they are ready: the service serves
whoever is connected meanwhile. A client that disconnects (``Bye``, or its
process died) is forgotten; ``close()`` waits for the others to leave
before the directory is removed, because they may still be reading from it.
If the service itself fails, every client is told why.
"""

import logging
import multiprocessing
import multiprocessing.connection as mpc
import os
import queue
import secrets
import threading

from .service_loop import ServiceLoop
from .stalls import Progress
from ..messages import Fail, Failure
from ..workers.loops import prefetcher_main
from ..workers.pool import Wake, WorkerPool

log = logging.getLogger(__name__)


_SUN_PATH_MAX = 107  # bytes of a Unix socket's path that Linux keeps (sockaddr_un.sun_path, less the NUL)


def _socket_address(local_dir):
    """Where the service listens: a socket in the 0700 job directory, or, when
    that path is too long for a Unix socket, a name in Linux's abstract
    namespace (no file; anyone on the host may knock, only the key opens)."""
    path = os.path.join(local_dir, ".service.sock")
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return path
    return "\0stager-service-" + secrets.token_hex(12)


class Doorway:
    """What a service's thread asks of its service: whether to stop, and who came in meanwhile."""

    def __init__(self):
        self._halt = threading.Event()
        self._incoming = queue.Queue()   # connections accepted, not yet served

    def halted(self):
        """Whether ``close()`` told the service thread to stop."""
        return self._halt.is_set()

    def accepted(self):
        """Connections the acceptor took since the last call (None for one that failed)."""
        while True:
            try:
                yield self._incoming.get_nowait()
            except queue.Empty:
                return


class StagingService(Doorway):
    """Stages files for the node's ranks (runs on the node leader only).

    Args:
        staging: The ``StagingConfig`` (prefetchers, task size).
        processes: The ``ProcessesConfig`` (shutdown timeout).
        catalog: The job's ``Catalog``.
        source: The ``Source`` the prefetchers fetch from.
        local_dir: The job's node-local directory (already created).
        remote_clients: Ranks of this node other than the leader.
        telemetry: The leader pipeline's ``Telemetry``; staging events go there.
        cache: The node's ``Cache`` (capacity, policy); from then on only the
            service thread touches it.
        on_staged: Optional callable ``(relpath, bytes, epoch)`` per file copied
            from the source.
        keep_fds: Descriptors the prefetchers keep open (see ``WorkerPool``).
        peers: The node leader's ``peers.Peers`` (``staging.peers``), or None.
        auto: With ``staging.prefetchers: auto``, an ``autocounts.AutoFetch``
            (how far the pool may grow while running, the files in flight it
            starts with); None: a fixed count.
        probed: ``{file index: bytes}`` the start's probe left in
            ``local_dir`` (``auto`` counts): a prefetcher finds them there,
            and they are counted as staged from the source with these bytes.
    """

    def __init__(self, staging, processes, catalog, source, local_dir, remote_clients, telemetry, cache,
                 on_staged=None, keep_fds=(), peers=None, auto=None, probed=None):
        super().__init__()
        self.staging = staging
        self.cache = cache
        self.shutdown_timeout_s = processes.shutdown_timeout_s
        self.catalog = catalog
        self.source = source
        self.local_dir = local_dir
        self.remote_clients = remote_clients
        self.telemetry = telemetry
        self.on_staged = on_staged
        self.keep_fds = keep_fds
        self.peers = peers
        self.auto = auto
        self.resizer = None  # an autocounts.PoolResizer with auto
        self.probed = dict(probed or {})  # the probe's copies, not yet asked for
        self.address = _socket_address(local_dir) if remote_clients else None
        self.authkey = secrets.token_bytes(32)
        self.pool = None
        self.progress = None
        self.wake = Wake()
        self._listener = None
        self._acceptor = None
        self._thread = None

    def start(self, ctx):
        """Starts the prefetchers, the acceptor and the service thread.

        Returns:
            The leader's own client connection.
        """
        # The board has a row for every prefetcher an ``auto`` pool may grow to.
        auto = self.auto
        most = getattr(self.source, "concurrency", 1)
        self.progress = Progress(ctx, max(self.staging.prefetchers, auto.limit if auto else 0), most)
        # Tuned files in flight: one bound the tuner moves, read by every prefetcher (no lock: one writer).
        in_flight = ctx.Value("i", auto.in_flight, lock=False) if auto and auto.in_flight else None
        self.pool = WorkerPool(ctx, "prefetch", "stager-prefetch", self.staging.prefetchers, prefetcher_main,
                               (self.source, self.local_dir, self.progress, in_flight), self.keep_fds)
        if auto is not None:
            self.resizer = auto.resizer(self.pool, self.telemetry, in_flight, most)
        if self.peers is not None:
            self.peers.start()
        if self.remote_clients:
            try:
                if not self.address.startswith("\0"):
                    os.unlink(self.address)  # left by a crashed run in a kept directory (ours, 0700)
            except FileNotFoundError:
                pass
            self._listener = mpc.Listener(self.address, family="AF_UNIX", backlog=self.remote_clients,
                                          authkey=self.authkey)
            self._acceptor = threading.Thread(target=self._accept, name="stager-accept", daemon=True)
            self._acceptor.start()
        own, theirs = multiprocessing.Pipe()
        self._thread = threading.Thread(target=self._run, args=(theirs,), name="stager-service", daemon=True)
        self._thread.start()
        return own

    def alive(self):
        """Whether the service thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def _accept(self):
        for _ in range(self.remote_clients):
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, mpc.AuthenticationError) as exc:
                if self._halt.is_set():
                    return
                log.warning("stager: a rank of this node failed to connect to the staging service: %s", exc)
                conn = None
            if self._halt.is_set():
                if conn is not None:
                    conn.close()
                return
            self._incoming.put(conn)
            self.wake.notify()

    def _run(self, own):
        loop = ServiceLoop(self, own)
        try:
            loop.run()
        except BaseException as exc:
            log.exception("stager: staging service failed")
            loop.fail(Failure.from_exception("prefetch", "service", exc, message=f"the node's staging service "
                                                                                 f"failed: {type(exc).__name__}: {exc}"))
        finally:
            _pass_on_failures(loop)
            for conn in loop.clients:
                conn.close()

    def close(self, wait_for_clients_s):
        """Stops the service once its clients have left, or after the wait.

        With peers, the node goes on serving other nodes' leaders until they
        have all stopped fetching (up to the same wait).

        Args:
            wait_for_clients_s: How long to wait for other ranks to disconnect;
                0 on an error path, where peers may never come.

        Returns:
            The pids of prefetchers stuck in the kernel, left running (see
            ``WorkerPool.stop``).
        """
        if self._thread is not None:
            self._thread.join(timeout=wait_for_clients_s)
            self._halt.set()
            self.wake.notify()
            self._thread.join(timeout=self.shutdown_timeout_s)
        if self.peers is not None:
            self.peers.close(wait_for_clients_s, self.shutdown_timeout_s)
        if self._acceptor is not None and self._acceptor.is_alive():
            try:  # unblocks accept(); it sees the halt flag and returns
                mpc.Client(self.address, family="AF_UNIX", authkey=self.authkey).close()
            except (OSError, EOFError, mpc.AuthenticationError):
                pass
            self._acceptor.join(timeout=self.shutdown_timeout_s)
        stuck = self.pool.stop(self.shutdown_timeout_s) if self.pool is not None else []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.wake.close()
        return stuck


def _pass_on_failures(loop):
    """Tells the node's ranks of a rank's failure that came as the service halted, before it hangs up on them.

    A failing leader sends its ``Fail`` and then stops the service at once;
    unread, the others would find only a closed connection and report that
    instead of the cause.
    """
    for conn in list(loop.clients):
        try:
            while loop.failed is None and conn.poll(0):
                msg = conn.recv()
                if isinstance(msg, Fail):
                    loop.on_client(conn, msg)
        except (EOFError, OSError):
            pass
