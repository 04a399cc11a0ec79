"""A job's side of a shared group: find the group's service or start it, and join it.

Every rank attaches on its own (no collective): it connects to the group's
address; if nobody listens it starts the service (``daemon.py``) with its
own job's setup and connects again. Two jobs starting a group at once both
try; one service wins the name, the other launcher says ``taken`` and its
job attaches to the winner. A service that is just ending closes the
connection before its welcome: the rank then starts a new one.
"""

import errno
import hashlib
import multiprocessing.connection as mpc
import os
import pickle
import socket
import subprocess
import sys
import time

import numpy as np

from . import names
from .owned import OwnedDir
from ..messages import Join
from ...errors import ConfigError, StageError
from ...storage import agreed_job_id, named_local_base
from ...storage.basedir import check_base

_TRIES = 5


def stream_key(spec, loader, options, rank):
    """The rank's decoded stream (``messages.Hello.stream``): equal for ranks that read and decode alike.

    None when the order is the front end's own (no plan description) or the
    decoding cannot be compared (a loader that does not pickle).
    """
    if spec is None or not hasattr(spec, "minibatches"):
        return None
    try:
        blob = pickle.dumps((spec, loader, sorted(options.items())), protocol=5)
    except Exception:
        return None
    return f"{hashlib.sha256(blob).hexdigest()[:32]}-{rank}"


def _connect(name):
    try:
        conn = mpc.Client(names.address(name), family="AF_UNIX")
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    uid = names.peer_uid(conn)
    if uid != os.getuid():
        conn.close()
        raise ConfigError(f"staging.share {name!r}: the group's address on this node is held by another user's "
                          f"process (uid {uid}); name another group")
    return conn


def _launch(setup):
    # The group's name on the command line also says in ``ps`` which group the service is.
    proc = subprocess.run([sys.executable, "-c", names.LAUNCHER, setup["name"]], input=pickle.dumps(setup),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=setup["start_timeout_s"])
    said = proc.stdout.decode().strip()
    if said not in ("ready", "taken"):
        raise StageError(f"staging.share {setup['name']!r}: could not start the group's staging service on this "
                         f"node: {said or proc.stderr.decode().strip()[-2000:]}", stage="prefetch")


def _handshake(conn, job, settings, timeout_s):
    """Sends ``Join`` on a new connection: ``(welcome or None, what went wrong)``; a refusal raises."""
    try:
        conn.send(Join(job, settings))
        if not conn.poll(timeout_s):
            conn.close()
            return None, f"no welcome within {timeout_s} s"
        welcome = conn.recv()
    except (EOFError, OSError) as exc:
        conn.close()
        return None, f"{type(exc).__name__}: {exc}"  # it was ending
    if welcome.refused:
        conn.close()
        raise ConfigError(welcome.refused)
    return welcome, None


def attach(name, job, settings, setup, timeout_s):
    """Joins the group ``name`` on this node, starting its service if none runs.

    Args:
        name: ``staging.share``.
        job: Who joins, for messages (``<job id> rank <r>``).
        settings: What every job of the group must agree on (``messages.Join``).
        setup: Callable returning the service's setup, should this rank start it.
        timeout_s: How long to wait for the service's welcome.

    Returns:
        ``(connection, messages.Welcome)``.

    Raises:
        ConfigError: The group runs with other settings (the setting is named).
        StageError: No service could be started or joined.
    """
    said = "no answer"
    for _ in range(_TRIES):
        conn = _connect(name)
        if conn is None:
            _launch(setup())
            conn = _connect(name)
            if conn is None:
                continue  # it ended at once (its founder died meanwhile): start another
        welcome, said = _handshake(conn, job, settings, timeout_s)
        if welcome is not None:
            return conn, welcome
        if said.startswith("no welcome"):
            break
    raise StageError(f"staging.share {name!r}: could not join the group's staging service on this node ({said})",
                     stage="prefetch")


def settings(staging, dataset, catalog, base):
    """What every job of a group must agree on, as ``{config key: value}`` (compared by the service)."""
    files = catalog.files
    digest = hashlib.sha256(np.ascontiguousarray(files.sizes).data)
    for i in {0, len(files.sizes) - 1} if len(files.sizes) else ():
        digest.update(files.path(i).encode())
    root = catalog.root if "://" in str(catalog.root) else os.path.realpath(catalog.root)
    return {"dataset.source": root, "dataset.format": dataset.format, "dataset.manifest": dataset.manifest,
            "dataset.keys": list(dataset.keys), "dataset.parts": list(dataset.parts),
            "dataset.endpoint_url": dataset.endpoint_url,
            "the catalog": f"{len(catalog)} samples in {len(files.sizes)} files, {int(files.sizes.sum())} bytes "
                           f"({digest.hexdigest()[:12]})",
            "staging.local_dir": os.path.realpath(base), "staging.capacity": staging.capacity,
            "staging.cache_policy": staging.cache_policy, "staging.prefetchers": staging.prefetchers,
            "staging.files_per_task": staging.files_per_task, "staging.verify": staging.verify,
            "staging.share_window": staging.share_window, "staging.decoded": staging.decoded}


def group_name(staging, world):
    """The group's name on this node: ``staging.share``, per emulated node where one machine plays several."""
    return staging.share + (f"-node{world.node}" if world.emulated_node else "")


def _base(staging, catalog):
    """``(the group's local base directory, where it came from)``.

    Raises:
        ConfigError: The directory lies inside the source.
    """
    # Not ``$STAGER_LOCAL_DIR``: the sbatch templates make it per Slurm job and remove it at the job's end,
    # while a group outlives the job that started it.
    base, base_name = named_local_base(staging.local_dir, with_env=False)
    base = os.path.abspath(base)
    if "://" not in str(catalog.root):
        src = os.path.realpath(catalog.root)
        if os.path.commonpath([os.path.realpath(base), src]) == src:
            raise ConfigError(f"{base_name} {base} lies inside the dataset source {src}; stager never writes to "
                              "the shared file system")
    return base, base_name


def _who(world, staging, dataset, catalog, asked):
    """``(group name, this rank's name, the settings to agree on, base dir, where the base came from)``."""
    base, base_name = _base(staging, catalog)
    job = f"{agreed_job_id(staging, world)} rank {world.rank}"
    return group_name(staging, world), job, settings(asked or staging, dataset, catalog, base), base, base_name


def find_or_claim(world, staging, dataset, catalog, asked=None):
    """Joins this node's group if its service runs, or claims the right to start it: ``(found, claim)``.

    A job whose counts are ``auto`` asks first, so that it takes the group's
    measurements (``Welcome.rates``) rather than reading the source for a
    probe of its own. Where no service runs, one job at a time holds the
    claim (a socket bound to ``names.founding_address``, released when it
    closes or its process dies) while it probes and starts the service;
    another job waits on it until it is released (an end-of-file on a
    connection to it), then looks again.

    Returns:
        ``(attach's result, None)`` where a service runs, else ``(None, the
        claim)``: a socket to close once the service is started.

    Raises:
        StageError: The job holding the claim kept it past the wait.
    """
    name, job, agreed, _, _ = _who(world, staging, dataset, catalog, asked)
    timeout_s = max(60.0, staging.stall_timeout_s)
    deadline = time.monotonic() + 2 * timeout_s  # its probe has the stall limit, its service's start as long
    while True:
        conn = _connect(name)
        if conn is not None:
            welcome, _ = _handshake(conn, job, agreed, timeout_s)
            if welcome is not None:
                return (conn, welcome), None
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(names.founding_address(name))
            claim.listen(64)
            return None, claim
        except OSError as exc:
            claim.close()
            if exc.errno != errno.EADDRINUSE:
                raise
        _wait_for_release(name, deadline)


def _wait_for_release(name, deadline):
    """Waits until the job holding the group's founding claim lets it go (or dies)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as knock:
        try:
            knock.connect(names.founding_address(name))
        except (ConnectionRefusedError, FileNotFoundError):
            return  # released meanwhile
        knock.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            knock.recv(1)  # never accepted: the claim's close resets it
        except socket.timeout:
            raise StageError(f"staging.share {name!r}: another job has been starting the group's service on this "
                             "node for too long", stage="prefetch") from None
        except OSError:
            pass


def probe_dir(world, staging, catalog):
    """A directory beside the group's, 0700 and removed if this process dies, for the probe's copies.

    The service that this job starts moves them into the group's directory
    (``daemon.GroupService``): the probe's reads are the group's first.
    Returns an object with ``path`` and ``remove()``.
    """
    base, base_name = _base(staging, catalog)
    check_base(base, base_name)
    return OwnedDir(base, f"{names.dir_prefix(group_name(staging, world))}probe-{os.getpid()}")


def join(world, staging, processes, dataset, catalog, spec, batch_size, ahead, asked=None, found=None, probe=None):
    """Attaches this rank to its node's group (``staging.share``): ``attach``'s result.

    Args:
        world: The ``World``.
        staging, processes, dataset: The job's config sections (``auto`` counts resolved).
        catalog: The job's ``Catalog``.
        spec: This rank's plan description, or None.
        batch_size: Samples per minibatch.
        ahead: Minibatches this rank asks for past the consumer.
        asked: The staging section as configured, compared with the group's
            (two jobs asking for ``auto`` agree even if they resolved it apart).
        found: ``find_or_claim``'s result, when this rank joined already.
        probe: Should this rank start the service: what its ``auto`` counts
            came from, ``{"rates", "in_flight", "probe_dir", "probed"}``
            (``daemon.GroupService``), or None.

    Raises:
        ConfigError: The group's local directory lies inside the source, or
            the group runs with other settings.
    """
    if found is not None:
        return found
    name, job, agreed, base, base_name = _who(world, staging, dataset, catalog, asked)

    def setup():
        return {"name": name, "settings": agreed, "founder": job, "catalog": catalog, "dataset": dataset,
                "staging": staging, "processes": processes, "base": base, "base_name": base_name,
                "batch_size": batch_size, "ahead": ahead, "ranks": world.local_size,
                "most": spec.most_files() if hasattr(spec, "most_files") else None,
                "start_timeout_s": max(60.0, processes.shutdown_timeout_s * 4), **(probe or {})}

    return attach(name, job, agreed, setup, max(60.0, staging.stall_timeout_s))
