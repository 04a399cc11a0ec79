"""The library's configuration sections: what a training job's pipeline reads.

Each section checks its own values when it is made, so an invalid value is
refused with the key at fault wherever the section comes from (YAML, a
dictionary, ``Config.replace``).
"""

import re
from dataclasses import dataclass, field
from typing import List, Optional, Union

from .fields import (check_choices, check_count, choice_field, decoded_modes, path_field, policies, require, shuffles,
                     splits, verify_modes)


@dataclass(frozen=True)
class DatasetConfig:
    """Where the samples live and how to decode them.

    Attributes:
        source: Dataset root on the shared file system (read only), or an
            object store prefix ``s3://bucket/prefix``.
        manifest: Manifest file (relative path per line, optional integer
            label after a tab). Relative to ``source`` unless absolute. None:
            scan the tree once (samples in first-level subdirectories are
            labelled by those directories' sorted index). Absolute paths,
            ``..`` and symbolic links leaving the root are refused with the
            line number.
        format: ``files`` (one sample per file), ``tar`` (WebDataset's
            shards: a sample is the members sharing a key), ``hdf5``
            (containers whose datasets ``keys`` hold one sample per row) or
            ``mds`` (MosaicML Streaming's shards, listed by the ``index.json``
            beside them, decoded by Streaming's encodings: the extra ``mds``);
            ``auto`` is ``hdf5`` when ``keys`` is set, ``tar`` when every
            file is a ``.tar``, else ``files``.
        keys: For ``hdf5`` containers, the datasets whose first axis indexes samples.
        parts: For ``tar`` shards, the parts (``jpg``, ``cls``, ...) each
            sample keeps; empty: every sample has the first sample's parts.
        loader: ``raw`` (bytes), ``npy``, ``hdf5`` (one ``.h5`` file per
            sample), ``image`` (JPEG or PNG, as RGB; JPEG through
            libjpeg-turbo's ``simplejpeg``, PIL for the rest and as the
            fallback) or ``module:function`` taking a path; for containers, how parts are decoded (``npy`` and
            ``image`` decode the parts of their kind, ``raw`` none; a
            ``module:function`` takes the sample's dict).
        hdf5_key: Dataset name inside each ``.h5`` file for the hdf5 loader.
        layout: What the ``image`` loader returns: ``hwc`` (uint8, height x
            width x channels, as decoded) or ``chw`` (float32, channels
            first, Chainer's ``LabeledImageDataset`` layout).
        extensions: When scanning, keep only files with these suffixes.
        catalog: A catalog file made by ``stager catalog build``, used
            instead of listing the source. None: rank 0 lists the source
            and broadcasts the catalog.
        broadcast_max: Entries up to which a catalog file is read by rank 0
            and broadcast; a larger one is memory-mapped by every rank, which
            then reads only the entries it uses.
        endpoint_url: For ``s3://`` sources, the object store's URL when it
            is not AWS (Ceph RGW, MinIO, ...); None: AWS. Credentials come
            from the standard AWS chain (environment, shared files,
            ``AWS_PROFILE``), never from this file.
        requests_in_flight: Files (objects) each prefetcher fetches at once,
            in threads, to cover the source's latency per file without more
            processes: the threads wait, the process's CPU is shared.
            ``auto``: tuned with ``staging.prefetchers: auto`` (threads before
            processes, docs/counts.md); else, as None, the source's default:
            16 for object stores (one connection pool), 1 for file trees.
        retries: For object stores, how many times a throttled (503
            SlowDown, 5xx) or timed out request is retried, with exponential
            backoff (0.1 s doubling to 2 s, jittered), before the run stops
            with an error naming the object.
        request_timeout_s: For object stores, connect and read timeout of one
            request.
    """

    source: str = path_field("")
    manifest: Optional[str] = None
    format: str = choice_field("auto", ("auto", "files", "tar", "hdf5", "mds"))
    keys: List[str] = field(default_factory=list)
    parts: List[str] = field(default_factory=list)
    loader: str = "npy"
    hdf5_key: str = "data"
    layout: str = choice_field("hwc", ("hwc", "chw"))
    extensions: List[str] = field(default_factory=list)
    catalog: Optional[str] = path_field(None)
    broadcast_max: int = 1_000_000
    endpoint_url: Optional[str] = None
    requests_in_flight: Union[int, str, None] = "auto"
    retries: int = 5
    request_timeout_s: float = 10.0

    def __post_init__(self):
        from ..formats import check_loader_name  # the registry lives with the loaders

        check_choices(self, "dataset")
        check_loader_name(self.loader)
        require(not self.keys or self.format in ("auto", "hdf5"),
                f"dataset.keys names HDF5 datasets; dataset.format is {self.format!r}")
        require(not self.catalog or (self.format in ("auto", "files") and not self.keys),
                "dataset.catalog (a file made by `stager catalog build`) lists files, one sample each; samples "
                "packed in containers (dataset.format tar or hdf5, dataset.keys) are indexed from the source: "
                "leave dataset.catalog unset")
        require(self.broadcast_max >= 0, "dataset.broadcast_max must be 0 (always map a catalog file) or more")
        require(self.endpoint_url is None or "://" in self.endpoint_url,
                f"dataset.endpoint_url must be a URL such as http://host:port, not {self.endpoint_url!r}")
        if self.requests_in_flight is not None:
            check_count(self.requests_in_flight, "dataset.requests_in_flight")
        require(self.retries >= 0, "dataset.retries must be 0 or more")
        require(self.request_timeout_s > 0, "dataset.request_timeout_s must be positive")



@dataclass(frozen=True)
class PlanConfig:
    """What order samples are read in (stage 1).

    Attributes:
        batch_size: Samples per minibatch.
        epochs: Epochs to run; 0 repeats without end.
        seed: Seed of every epoch's permutation (combined with the epoch).
        shuffle: Permute each epoch; False reads in catalog order.
        drop_last: Drop the last, short minibatch of each epoch.
        remainder: Under MPI, when the sample count is not a multiple of the
            number of ranks: ``pad`` repeats a few samples so every rank reads
            as many, ``drop`` leaves a few out of that epoch.
        shuffle_algorithm: How epochs are permuted (``plan.shuffles``):
            ``pcg64`` draws each epoch's whole permutation (the order of
            every earlier run, the default so that saved runs keep their
            order); ``feistel`` evaluates each rank's positions on their
            own, in time and memory proportional to the rank's share (for
            datasets of tens of millions of samples and more); ``torch``
            is ``DistributedSampler``'s (``torch.randperm`` seeded with
            seed + epoch); ``torch_sampler``, ``torch_loader`` and
            ``torch_loader_persistent`` are ``RandomSampler``'s and
            ``DataLoader(shuffle=True)``'s (with persistent workers) over a
            generator seeded once, as ``StagedLoader`` chooses for one
            process with a seeded generator; ``shards`` (for ``dataset.format`` tar or hdf5)
            permutes the containers, then the samples within each window of
            ``shard_window`` containers, so the node stages a window's
            containers at a time instead of every one.
        shard_window: With ``shuffle_algorithm: shards``, each epoch permutes
            the containers, then the samples of each window of this many
            containers among themselves: a wider window mixes better and
            needs more local space (about twice the window's containers).
        split: How each global minibatch is shared among the ranks
            (``plan.splits``): ``contiguous`` gives rank r the r-th run of
            ``batch_size`` samples; ``strided`` every size-th sample from
            r, as ``DistributedSampler`` does (with ``shuffle_algorithm:
            torch`` and ``remainder``, exactly its shares).
    """

    batch_size: int = 32
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    remainder: str = choice_field("pad", ("pad", "drop"))
    shuffle_algorithm: str = choice_field("pcg64", shuffles)
    shard_window: int = 8
    split: str = choice_field("contiguous", splits)

    def __post_init__(self):
        check_choices(self, "plan")
        require(self.batch_size >= 1, "plan.batch_size must be at least 1")
        require(self.shard_window >= 1, "plan.shard_window must be at least 1")
        require(self.epochs >= 0, "plan.epochs must be 0 (repeat) or more")



@dataclass(frozen=True)
class StagingConfig:
    """Copying minibatches to node-local storage ahead of use (stage 2).

    Attributes:
        enabled: False reads the source directly (the baseline).
        local_dir: Node-local base directory. None: ``$STAGER_LOCAL_DIR``
            (the sbatch templates set it), then ``$SLURM_TMPDIR``, then
            ``$TMPDIR``, then ``/tmp``. Checked at start (reliability page).
        job_id: Name of this job's directory under local_dir. None:
            ``$SLURM_JOB_ID``, else a generated id.
        prefetchers: Prefetcher processes of the node, or ``auto`` (the
            default): chosen at start from a probe of the plan's first files
            and this machine's cores and memory (``stager.model``), then
            grown or shrunk while running as the measured rates change, files
            in flight before processes (docs/counts.md).
        lookahead: Minibatches staged ahead of the one being consumed, or
            ``auto``: 16, cut where the node's capacity is tight to the
            deepest look-ahead (at least 2) that leaves room beside it for
            the node's share of the dataset, the files the job reads again
            (said in the run's first lines); while running, deeper (up to
            64, room allowing) where the measured fetch time over the
            training's step needs it and prefetchers stand idle. A fixed
            depth that takes that room is warned about at start, with the
            bytes it costs.
        files_per_task: Files a prefetcher copies per task; 0 = a
            minibatch's missing files spread over all prefetchers, so the
            first minibatch is ready after a few opens, not a whole batch.
        node_schedule: The order the node's prefetchers take the tasks of
            its ranks in: ``deadline``, earliest minibatch of any rank first
            (a rank whose files are slower is served before the others'
            later minibatches, so the node's ranks stay in step);
            ``arrival``, in the order the ranks asked (a rank that asked
            far ahead fills the queue in front of a neighbour's next
            minibatch; for comparison).
        keep: Keep the job's staging directory after the run.
        capacity: Bytes the node's job directory may hold, all its ranks
            together: ``auto`` (80% of the local file system's free space
            at start, shared by the stager jobs running there; unbounded
            when the whole dataset fits; the look-ahead cut when its window
            does not; said in the run's first line), a number of bytes, ``500M``/``200G``
            (powers of 1024), ``80%`` of the free space at start, or
            ``unbounded`` (also null).
        cache_policy: Which files stay local once read, and which go when
            room is needed (``cache.policies``): ``clairvoyant``, ``lru``,
            ``fifo``, ``minio``, ``none``, ``unbounded``; ``auto`` is
            ``clairvoyant`` with a capacity, ``unbounded`` without.
        peers: ``off`` (quote it in YAML: a bare off reads as false): each
            node reads what it misses from the source;
            ``partition``: node leaders share their caches over MPI: a file
            is read from the source by its owner (the node that reads it in
            the first epoch) and fetched from the owner's copy by the others.
            Needs an MPI launcher.
        peer_choice: With peers, when a file is fetched from its holder:
            ``holder``, always (the shared file system sees each file once
            per job; a holder that has not staged it or answered within
            ``stall_timeout_s`` is given up on for it, and the report counts
            those reads); ``measured``, when the measured rates say a peer
            is faster than the source (a source that looks fast to one node
            may still be loaded by every other).
        peer_swaps: With peers and a bounded capacity, a node that drops a
            file it holds for the job to make room for one it takes from a
            holder gives that holder the dropped file (in the place of the
            copy it hands on), so the nodes read the shared file system
            nearer the job-wide optimum where they hold less than about
            1.2x the dataset together. It moves up to a file between nodes
            per file fetched and sends some reads on to where a file went:
            off by default.
        stall_timeout_s: Seconds a prefetcher may wait for one file (an
            open or read that does not return: a hung file system) before
            the job fails, naming the file and the prefetcher; 0 waits
            without end.
        verify: How each copy from a file tree is checked before it is
            published (``sources.verify``): ``none``, its byte count only;
            ``size``, also the source's size, mtime and ctime unchanged
            across the copy; ``xxhash``, also the copy's hash equal to a
            second read's (needs the ``xxhash`` extra). A copy the source
            changed under is made again,
            up to 3 times, then the job fails naming the file.
        share: A group name: jobs of this user on one node that name the
            same group (separate launches, arriving and leaving at any time)
            share one staging service: one copy of each file on local
            storage, one cache whose policy sees every job's future, and,
            for jobs with the same order and decoding, each minibatch
            decoded once (``docs/sharing.md``). None: the job stages alone.
        share_window: With ``share``, decoded minibatches of each stream (a
            rank's order and decoding) kept in shared memory for the jobs
            behind the first: the leader never waits, and a job further
            behind decodes for itself. It costs up to this many decoded
            minibatches of memory in ``/dev/shm`` per stream.
        decoded: Decoded copies of samples beside the staged files
            (``docs/decoded.md``): ``on``, a reader keeps each sample it
            decodes with a loader known to be pure (torchvision's default
            image loader, stager's ``image`` loader, Chainer's image
            datasets) as the loader returned it, and in later epochs builds
            the same object from that copy instead of decoding; ``auto``
            (the default), the same, where each reader measures that
            reading a copy back costs less than decoding; ``off``, never.
            Decoded copies take only the room the capacity leaves beside
            every encoded file of the dataset.
    """

    enabled: bool = True
    local_dir: Optional[str] = path_field(None)
    job_id: Optional[str] = None
    prefetchers: Union[int, str] = "auto"
    lookahead: Union[int, str] = "auto"
    files_per_task: int = 0
    node_schedule: str = choice_field("deadline", ("deadline", "arrival"))
    keep: bool = False
    capacity: Optional[str] = "auto"
    cache_policy: str = choice_field("auto", policies)
    peers: str = choice_field("off", ("off", "partition"))
    peer_choice: str = choice_field("holder", ("holder", "measured"))
    peer_swaps: bool = False
    stall_timeout_s: float = 300.0
    verify: str = choice_field("size", verify_modes)
    share: Optional[str] = None
    share_window: int = 16
    decoded: str = choice_field("auto", decoded_modes)

    def __post_init__(self):
        from ..cache import parse_capacity  # the rule lives with the cache
        from ..sources.verify import check_mode  # the modes live with the check

        if isinstance(self.decoded, bool):  # YAML reads a bare on or off as a boolean
            object.__setattr__(self, "decoded", "on" if self.decoded else "off")
        check_choices(self, "staging")
        check_mode(self.verify)
        bounded = parse_capacity(self.capacity)
        require(not (bounded and bounded[0] != "auto" and self.cache_policy == "unbounded"),
                "staging.cache_policy 'unbounded' cannot keep to staging.capacity; choose clairvoyant, lru, fifo, "
                "minio or none (or auto)")
        check_count(self.prefetchers, "staging.prefetchers")
        check_count(self.lookahead, "staging.lookahead")
        require(self.files_per_task >= 0, "staging.files_per_task must be 0 (automatic) or more")
        require(self.stall_timeout_s >= 0, "staging.stall_timeout_s must be 0 (wait without end) or more seconds")
        require(self.share is None or (isinstance(self.share, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,64}",
                                                                                     self.share) is not None),
                f"staging.share must be a group name of 1 to 64 letters, digits, '.', '_' or '-', not {self.share!r}")
        require(self.share is None or self.peers == "off",
                "staging.share (jobs of one node sharing a service) and staging.peers (nodes of one job sharing "
                "their caches) cannot be combined yet: set one of them")
        require(self.share is None or self.enabled, "staging.share needs staging.enabled: true")
        require(self.share_window >= 1, "staging.share_window must be at least 1 minibatch")



@dataclass(frozen=True)
class ReaderConfig:
    """Turning staged files into decoded minibatches (stage 3).

    Attributes:
        workers: Reader processes of each rank, or ``auto`` (the default, as
            ``staging.prefetchers``); a front end's ``num_workers`` sets it.
        ahead: Minibatches decoded ahead of the consumer; 0 = 2 x workers.
    """

    workers: Union[int, str] = "auto"
    ahead: int = 0

    def __post_init__(self):
        check_count(self.workers, "reader.workers")
        require(self.ahead >= 0, "reader.ahead must be 0 (auto) or more")
