"""How much of the node-local file system a job may fill when nobody said: ``staging.capacity: auto``.

The default capacity is a share of the local file system's free space at
start (``AUTO_SHARE``; the rest is the reserve, for the file system and
everything else on the node), divided among the stager jobs running under
the same base directory at that moment, this one included. A job whose
whole dataset fits needs no bound: it is unbounded (every file kept, no
eviction to compute). A job that later meets a full disk below its capacity
(jobs that started after it took their share of what was free) evicts and
retries rather than failing.
"""

import os

from ..cache.capacity import check_window, human, parse_capacity, resolve_capacity, window_bytes
from ..errors import ConfigError
from .leftovers import live_jobs

AUTO_SHARE = 0.8


def free_share(job_dir):
    """``(bytes, where)``: this job's share of its file system's free space now (``AUTO_SHARE``, split among jobs)."""
    st = os.statvfs(job_dir)
    free = st.f_bavail * st.f_frsize
    jobs = 1 + live_jobs(os.path.dirname(job_dir), own=job_dir)
    shared = f", shared by {jobs} stager jobs there" if jobs > 1 else ""
    where = f"{AUTO_SHARE:.0%} of the {human(free)} free on {os.path.dirname(job_dir)} at start{shared}"
    return int(AUTO_SHARE * free / jobs), where


def auto_capacity(job_dir, dataset_bytes):
    """``(capacity in bytes or None for unbounded, why)`` for a job directory, from its file system's free space.

    Args:
        job_dir: The job's directory (made): its file system is the one measured.
        dataset_bytes: Bytes of the files this node could ever stage (the catalog's).
    """
    capacity, where = free_share(job_dir)
    if dataset_bytes <= capacity:
        return None, f"unbounded: the whole dataset ({human(dataset_bytes)}) fits in {human(capacity)}, {where}"
    return capacity, f"{human(capacity)}: {where}; the dataset is {human(dataset_bytes)}"


def staging_capacity(staging, job_dir, sizes, batch_size, ahead, ranks, most=None):
    """The node cache's capacity, and the look-ahead that fits it.

    Args:
        staging: The ``StagingConfig``.
        job_dir: The job's directory (made).
        sizes: The catalog's sizes.
        batch_size: Samples per minibatch on one rank.
        ahead: Minibatches each rank may have staged and not yet read.
        ranks: Ranks sharing the node's cache.
        most: ``ahead -> the most files that look-ahead can touch``, when the
            plan bounds it more tightly than a minibatch per file (the
            ``shards`` shuffle), or None.

    Returns:
        ``(capacity, ahead, window, note)``: bytes or None (unbounded); the
        look-ahead, cut when an ``auto`` capacity cannot hold the one asked
        for; the window's bytes; for ``auto``, the line saying what was
        chosen and why, else None.

    Raises:
        ConfigError: An explicit capacity below the window (``check_window``),
            or an ``auto`` one that cannot hold one minibatch per rank.
    """
    parsed = parse_capacity(staging.capacity)
    if not (parsed and parsed[0] == "auto"):
        capacity = resolve_capacity(staging.capacity, job_dir)
        return capacity, ahead, check_window(capacity, sizes, batch_size, ahead, ranks, most), None
    if staging.cache_policy == "unbounded":
        return None, ahead, window_bytes(sizes, batch_size, ahead, ranks, most), \
            "staging.capacity auto: unbounded, as staging.cache_policy says"
    capacity, why = auto_capacity(job_dir, int(sizes.sum()))
    window = window_bytes(sizes, batch_size, ahead, ranks, most)
    if capacity is not None and capacity < window and most is None:
        largest = window // (ranks * ahead)
        fits = capacity // (ranks * largest)
        if fits < 1:
            raise ConfigError(f"staging.capacity auto is {why}: too small for even one minibatch per rank "
                              f"({ranks} x {human(largest)}); give staging.local_dir a larger file system, or set "
                              "staging.capacity")
        why += f"; the look-ahead cut from {ahead} to {fits} minibatches so that its window fits"
        ahead, window = fits, window_bytes(sizes, batch_size, fits, ranks)
    elif capacity is not None and capacity < window:
        fits = max((a for a in range(1, ahead + 1) if window_bytes(sizes, batch_size, a, ranks, most) <= capacity),
                   default=0)
        if not fits:
            raise ConfigError(f"staging.capacity auto is {why}: too small for the containers one minibatch per "
                              "rank touches; give staging.local_dir a larger file system, or set staging.capacity")
        why += f"; the look-ahead cut from {ahead} to {fits} minibatches so that its window fits"
        ahead, window = fits, window_bytes(sizes, batch_size, fits, ranks, most)
    return capacity, ahead, window, f"staging.capacity auto: {why}"
