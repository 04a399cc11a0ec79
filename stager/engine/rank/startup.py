"""How a pipeline is wired at start: the counts, the node's staging service or group, the readers.

``Pipeline.start()`` (collective under MPI) runs ``Startup._launch``: find
the world, agree on the catalog (rank 0 lists the source) and the job id,
resolve ``auto`` counts, then on the node leader create the job directory
and the staging service (cache, peers, prefetchers) and tell the node's
other ranks where it listens; every rank then starts its readers and its
coordinator. ``Startup`` holds this half of ``Pipeline`` (its start-up
state lives on the pipeline); ``pipeline.py`` the life cycle and the
consumer's side.
"""

import collections
import logging
import multiprocessing
import multiprocessing.connection as mpc
import threading
import weakref
from dataclasses import replace

from .coordinator import Coordinator
from .. import group
from .. import perf
from ..messages import Hello
from ..perf.probe import first_files, peek_first_files
from ..tuning import autocounts
from ..tuning.deepening import Deepening
from ..wire import Ring
from ..workers.limits import check_worker_counts
from ..workers.loops import reader_main
from ..workers.pool import WorkerPool, children_skip_mpi
from ... import plan as planlib
from ...cache import MAX_DEPTH, MIN_DEPTH, Cache, depth_note, fitting_depth, lookahead_depth, policy_name, window_bytes
from ...catalog import agreed_catalog
from ...decoded import create as create_tier, create_shared, shared_note, tier_choice
from ...formats import decoded_kind, make_decoder
from ...errors import ConfigError, StageError
from ...sources import open_source
from ...storage import JobDir, agreed_job_id, staging_capacity
from ...world import agree, detect, split_leaders

log = logging.getLogger(__name__)


def _more_rings(rings, count):
    """Shared memory for ``count`` more readers (an ``auto`` pool growing): ``(keep_fds, owned)``."""
    new = [Ring() for _ in range(count)]
    rings.extend(new)  # reader i uses rings[i]; the pool's indices only grow
    return [fd for r in new for fd in r.fds], new




class Startup:
    """The start-up half of ``Pipeline``: what ``start()`` builds and connects."""

    def _launch(self):
        if self.world is None:
            self.world = detect(self._world_cfg.mpi, self._world_cfg.backend)
        world = self.world
        if self.catalog is None:
            self.catalog = agreed_catalog(world.comm, self._dataset, self._staging.stall_timeout_s)
        spec, minibatches = self._rank_plan()
        ch, ctx = self._ch, multiprocessing.get_context(self._processes.start_method)
        tuned = autocounts.tunes_in_flight(self._staging, self._dataset)
        source = open_source(self.catalog.root, self._dataset, self._staging.verify,
                             perf.MAX_IN_FLIGHT if tuned else None)
        if not self._staging.enabled or world.node_leader:
            try:
                # Workers forked from here inherit what the source prepares (an object store's session).
                getattr(source, "warm", lambda: None)()
            except Exception:
                pass  # a worker's first fetch meets the same error and reports it with its context
        auto_prefetch, auto_read = (autocounts.is_auto(self._staging.prefetchers),
                                    autocounts.is_auto(self._reader.workers))
        shared = world.node_comm is not None and world.local_size > 1
        own_dir = self._staging.enabled and not self._staging.share
        share = self._staging.enabled and bool(self._staging.share)
        if own_dir:
            self._jobdir = JobDir(self._staging, self.catalog.root, agreed_job_id(self._staging, world), world)
            self._jobdirs.append(self._jobdir)
        # Collective: before the probe, which with peers reads only what this node reads from the source.
        peer_link = self._join_peers() if own_dir else None
        holders = reads_from_source = None
        if peer_link is not None and world.node_leader:
            from ..peers import node_holders, reads_from_source  # imported where used: see _connect_service
            holders = node_holders(peer_link, spec, self.catalog)
        # The probe reads the plan's first files (or containers) into the job's directory, where the
        # prefetchers find them; with peers, only those this node is the first to read (the others come
        # from the nodes that read them before it): a node with none takes another leader's measurements.
        first = None
        if (auto_prefetch or auto_read) and world.node_leader:
            if spec is not None:
                keep = None if holders is None else (lambda file, seq: reads_from_source(holders, file, seq))
                first = first_files(self.catalog, spec.minibatches(world.rank), keep=keep) or None
            else:  # a plan drawn as it goes (Chainer's orders): read once, so what the probe looked at goes back
                first, minibatches = peek_first_files(self.catalog, minibatches)
                first = first or None
        into = self._jobdir.create if own_dir and first else None
        given = None
        if share and world.node_leader and (auto_prefetch or auto_read):
            given, into = self._group_measurements(first)
        self._staging, self._reader, self._auto, in_flight = autocounts.resolve(
            self._staging, self._reader, self._dataset, getattr(spec, "batch_size", self._plan_cfg.batch_size),
            self.catalog, source, world.node_comm if shared else None, self._loader, first,
            into, None if holders is None else peer_link[0], given)
        self._in_flight = in_flight or getattr(source, "concurrency", 1)
        auto = None
        if auto_prefetch and self._staging.enabled:
            auto = autocounts.AutoFetch.of(self._auto, in_flight, getattr(source, "concurrency", 1))
        self._probed = {}  # the probe's copies in the job's directory, which the service counts as staged
        if self._auto is not None and first and world.node_leader and (own_dir or self._group_probe is not None):
            self._probed = {f: int(self.catalog.files.sizes[f]) for f in self.catalog.file_index(first).tolist()}
        if self._group_probe is not None:  # what the group's service, should this job start it, starts from
            self._group_setup = {"rates": self._auto.to_dict(), "auto_fetch": auto_prefetch, "in_flight": in_flight,
                                 "probe_dir": self._group_probe.path, "probed": self._probed}
        # The counts as they start (auto ones resolved), before any worker or directory exists.
        check_worker_counts(self._staging, self._reader, world.local_size, world.node_leader)
        if auto_read and not self._reader.ahead:
            # Room to hand a grown pool work: as far ahead as its largest size would read.
            self._reader = replace(self._reader, ahead=2 * max(self._reader.workers,
                                                               autocounts.reader_limit(self._auto)))
        with children_skip_mpi(self._processes.start_method):
            # Staging off: readers open the source's items in place, or have the source fetch each one.
            read_root = source.local_root or source
            if read_root is source and not hasattr(source, "open_direct"):
                raise ConfigError(f"staging.enabled is false, but {self.catalog.root} holds no files readers can "
                                  "open in place: enable staging")
            options = {"hdf5_key": self._dataset.hdf5_key, "layout": self._dataset.layout}
            if self._staging.enabled and self._staging.share:
                read_root = self.local_dir = self._join_group(spec)
                stream = group.stream_key(spec, self._loader, options, world.rank)
                ch.claims = stream is not None
                ch.shelf_gone = collections.deque() if ch.claims else None
                ch.send(Hello(world.rank, spec, stream, self._ahead()))
            elif self._staging.enabled:
                self.local_dir = self._jobdir.path
                read_root = self._connect_service(ctx, source, spec, peer_link, holders, auto)
                ch.send(Hello(world.rank, spec, ahead=self._ahead()))
            read_ahead = self._reader.ahead or 2 * self._reader.workers
            deepening = None
            if self._deepest > self._ahead():
                deepening = Deepening(self._ahead(), self._deepest, self.stats.telemetry)
            coordinator = Coordinator(ch, minibatches, self.catalog, self.stats.telemetry, self._ahead(), read_ahead,
                                      deepening)
            if self._staging.enabled:
                coordinator.ask()  # the prefetchers start on the first minibatch while the readers start
            rings = [Ring() for _ in range(self._reader.workers)]
            ch.readers = WorkerPool(ctx, "read", "stager-read", self._reader.workers, reader_main,
                                    (read_root, self.catalog.sample_decoder(self._loader, options), options, rings),
                                    keep_fds=[fd for r in rings for fd in r.fds],
                                    recv=lambda i, conn: rings[i].recv(conn), owned=rings)
            if auto_read:
                ch.read_resizer = autocounts.PoolResizer(ch.readers, autocounts.READ,
                                                         autocounts.reader_limit(self._auto), self.stats.telemetry,
                                                         before_grow=lambda count: _more_rings(rings, count))
        ch.on_end = weakref.WeakMethod(self._finish)
        self._coordinator = threading.Thread(target=coordinator.run, name="stager-coordinator", daemon=True)
        self._coordinator.start()

    def _rank_plan(self):
        """This rank's plan: ``(description or None, iterator of Minibatch)``."""
        plan, rank = self._plan, self.world.rank
        if plan is None:
            plan = planlib.PlanSpec.from_config(len(self.catalog), self._plan_cfg, self.world.size, self._start,
                                                self.catalog.containers)
        if hasattr(plan, "minibatches"):
            return plan, iter(plan.minibatches(rank))
        return None, iter(plan)

    def _ahead(self):
        """Minibatches the coordinator asks for past the consumer (staged, not yet read)."""
        return max(lookahead_depth(self._staging.lookahead), self._reader.ahead or 2 * self._reader.workers)

    def _join_peers(self):
        """With ``staging.peers: partition``, the leaders' communicator (collective); else None."""
        if self._staging.peers == "off":
            return None
        world = self.world
        if world.comm is None or world.source != "mpi":
            raise ConfigError("staging.peers is 'partition', but this run has no MPI communicator (world.mpi off, "
                              "or not started by an MPI launcher): node leaders share their caches over MPI; start "
                              "the job under mpiexec or srun, or set staging.peers: off")
        return split_leaders(world)

    def _connect_service(self, ctx, source, spec, peer_link, holders, fetch_auto=None):
        """Starts (leader) or joins (other ranks) the node's staging service.

        Args:
            ctx: The multiprocessing context.
            source: The ``Source`` the prefetchers fetch from.
            spec: This rank's plan description, or None.
            peer_link: ``world.split_leaders``'s result (``staging.peers``), or None.
            holders: With ``peer_link``, on the node leader, ``peers.node_holders``'s result.
            fetch_auto: With ``staging.prefetchers: auto``, an ``autocounts.AutoFetch``.

        Returns:
            The node-local directory to read staged files from.
        """
        # Imported here, not with this module: a job of a shared group (``staging.share``) runs neither the
        # node's own service nor peers, and every job of a group pays its imports' CPU again at its start.
        from ..node.service import StagingService
        from ..peers import node_peers

        world, ch = self.world, self._ch
        shared = world.node_comm is not None and world.local_size > 1

        def start_service():
            path = self._jobdir.create()
            ranks = world.local_size if shared else 1
            batch_size = getattr(spec, "batch_size", self._plan_cfg.batch_size)
            files = self.catalog.files
            most = spec.most_files() if hasattr(spec, "most_files") else None
            auto = self._staging.lookahead == "auto"
            capacity, ahead, window, note = staging_capacity(self._staging, path, files.sizes, batch_size,
                                                             min(MIN_DEPTH, self._ahead()) if auto else self._ahead(),
                                                             ranks, most)
            if note:
                log.info("stager: %s", note)
            ahead, window, deepest = self._fit_depth(capacity, ahead, window, files.sizes, batch_size, ranks, most)
            self._fit_ahead(ahead)
            cache = Cache(files.sizes, policy_name(self._staging.cache_policy, capacity), capacity, window,
                          self.catalog.file_index)
            self._decoded_tier(path, spec, capacity, int(files.sizes.sum()))
            peers = None
            if peer_link is not None:
                # As many peer fetch threads as prefetchers, or as files they keep in flight where tuned.
                peers = node_peers(peer_link, holders, source, path,
                                   self._staging.prefetchers * (fetch_auto.in_flight or 1 if fetch_auto else 1),
                                   self.stats.telemetry, self._staging.peer_choice, self._staging.stall_timeout_s,
                                   self._staging.peer_swaps)
                peers.keep_in(cache)
            ch.service = StagingService(self._staging, self._processes, self.catalog, source, path, ranks - 1,
                                        self.stats.telemetry, cache, self._on_staged, self._jobdir.keep_open(),
                                        peers, fetch_auto, self._probed)
            ch.client = ch.service.start(ctx)
            return path, ch.service.address, ch.service.authkey, ahead, deepest

        if not world.node_leader and not shared:
            raise StageError("a rank that is not its node's leader has no node communicator", stage="prefetch")
        path, address, authkey, ahead, self._deepest = agree(
            world.node_comm if shared else None, start_service,
            lambda text: StageError(f"the node leader could not start staging: {text}", stage="prefetch"))
        self._fit_ahead(ahead)  # the node's window, the same on every rank of it
        if not world.node_leader:
            ch.client = mpc.Client(address, family="AF_UNIX", authkey=authkey)
        return path

    def _decoded_tier(self, path, spec, capacity, dataset_bytes, group=False):
        """On the node leader: makes the job's decoded tier (``staging.decoded``) where it has room and a use.

        Args:
            group: ``path`` is a ``staging.share`` group's directory: the
                tier is the group's, made by the first job that can use one.
        """
        mode = self._staging.decoded
        options = {"hdf5_key": self._dataset.hdf5_key, "layout": self._dataset.layout}
        decoder = make_decoder(self.catalog.sample_decoder(self._loader, options), options)
        once = spec is not None and getattr(spec, "epochs", 0) - getattr(spec.start, "epoch", 0) == 1
        pure = getattr(decoder, "keeps_decoded", lambda: False)()
        budget, why = tier_choice(mode, pure, once, capacity, path, dataset_bytes)
        if group and pure and mode != "off":
            kind = decoded_kind(decoder)
            why = shared_note(create_shared(path, len(self.catalog), budget, mode, kind, why), kind, why)
        elif budget:
            create_tier(path, len(self.catalog), budget, mode, decoded_kind(decoder))
        self.stats.decoded_note = why
        if budget:
            log.info("stager: staging.decoded %s: %s", mode, why)

    def _group_measurements(self, first):
        """On the node leader, with ``auto`` counts and ``staging.share``: ``resolve``'s ``given`` and ``into``.

        ``given`` joins the group if its service runs and takes its probe
        and counts (``Welcome``): this job reads nothing of the source for
        its own. Where none runs, it takes the group's founding claim (one
        job at a time probes and starts the service), and ``into`` makes the
        directory the probe's copies go to, which the service this job
        starts moves into the group's: the probe's reads are the group's
        first, not repeated.
        """
        world = self.world

        def given():
            self._group_found, self._group_claim = group.find_or_claim(world, self._staging, self._dataset,
                                                                       self.catalog, self._asked)
            welcome = None if self._group_found is None else self._group_found[1]
            return None if welcome is None or welcome.rates is None else (welcome.rates, welcome.counts)

        def into():
            self._group_probe = group.probe_dir(world, self._staging, self.catalog)
            return self._group_probe.path

        return given, into if first else None

    def _join_group(self, spec):
        """Attaches this rank to its node's shared group (``staging.share``); returns the group's directory.

        The node leader joins first, so that the service it may start is
        the one its probe's copies were made for; the node's other ranks
        then find it running.
        """
        batch_size = getattr(spec, "batch_size", self._plan_cfg.batch_size)
        world = self.world
        joined = {}

        def join():
            joined["it"] = group.join(world, self._staging, self._processes, self._dataset, self.catalog, spec,
                                      batch_size, self._ahead(), self._asked, self._group_found, self._group_setup)
            if world.node_leader:  # before the node's ranks go on to start readers, which open the tier once
                welcome = joined["it"][1]
                self._decoded_tier(welcome.local_dir, spec, welcome.capacity, int(self.catalog.files.sizes.sum()),
                                   group=True)
            return True

        if world.node_comm is not None and world.local_size > 1:
            agree(world.node_comm, join, lambda text: StageError(
                f"the node leader could not join the group {self._staging.share!r}: {text}", stage="prefetch"))
        if "it" not in joined:
            join()
        self._group_found = None
        self._drop_group_probe()  # its copies are in the group's directory by now, or not wanted
        self._ch.client, welcome = joined["it"]
        self._fit_ahead(welcome.ahead)
        self._ch.linger = 3 * self._processes.shutdown_timeout_s  # the service's own shutdown, if this job is last
        return welcome.local_dir

    def _drop_group_probe(self):
        """Removes the probe's directory made for the group's service and lets the founding claim go
        (``_group_measurements``); idempotent."""
        if self._group_probe is not None:
            self._group_probe.remove()
            self._group_probe = None
        if self._group_claim is not None:
            self._group_claim.close()
            self._group_claim = None

    def _fit_depth(self, capacity, ahead, window, sizes, batch_size, ranks, most):
        """The node's look-ahead: ``auto``'s depth for the capacity; a fixed one, warned about when it costs.

        Returns:
            ``(ahead, window, deepest)``: minibatches per rank, the bytes their
            window may pin, and the deepest ``auto`` may grow to while
            running (``deepening``; ``ahead`` for a fixed depth).
        """
        total = int(sizes.sum())
        share = ranks / max(1, self.world.size)
        depth, keep = fitting_depth(capacity, total, len(sizes), batch_size, ranks, share)
        step = ranks * batch_size * total / max(1, len(sizes))
        said = depth_note(self._staging.lookahead, depth, capacity, keep, step)
        if said is not None:
            getattr(log, said[0])("stager: %s", said[1])
        if self._staging.lookahead != "auto":
            return ahead, window, ahead

        def fitting(ahead):
            while ahead > 1 and capacity is not None and window_bytes(sizes, batch_size, ahead, ranks, most) > capacity:
                ahead -= 1
            return ahead

        ahead = fitting(min(self._ahead(), depth))
        deepest = fitting(fitting_depth(capacity, total, len(sizes), batch_size, ranks, share, MAX_DEPTH)[0])
        return ahead, window_bytes(sizes, batch_size, ahead, ranks, most), max(ahead, deepest)

    def _fit_ahead(self, ahead):
        """Cuts this rank's look-ahead (staged and decoded ahead) to ``ahead``, the most the node cache fits."""
        if ahead < self._ahead():
            self._staging = replace(self._staging, lookahead=ahead)
            self._reader = replace(self._reader, ahead=min(self._reader.ahead or 2 * self._reader.workers, ahead))
