"""The job in simulated time (SimPy): the stages of every node over a shared file system.

What each node fetches at each step comes from ``demand`` (exact, from the
plan); this module adds when. Per node, the service asks for step ``s`` once
every rank of the node has consumed step ``s - ahead`` (with ``staging.lookahead:
auto``, ``ahead`` deepens as the engine's ``Deepening`` decides, fed the
node's fetch spans and idle prefetchers and its first rank's steps), splits its files into
at most one chunk per file in flight (a chunk's files are fetched one after
the other by one thread of a prefetcher: in aggregate, one event for several
files), and the step is ready when its chunks are. A chunk waits on the
source holding its file in flight only; its copy's CPU holds its prefetcher
process too (``resources.Fetchers``). Each rank's readers decode a ready step
once it is within ``read_ahead`` of the rank's position, and the rank's
coordinator thread receives it (the rank's own CPU, one step at a time, in
parallel with the training step); the rank waits for it (the stall), then
computes.

A fetch of ``k`` files and ``b`` bytes from the shared file system takes
``k`` open latencies, ``k`` operations of the metadata service (one queue
for every node, at its rate less other jobs' share), ``b`` bytes through the
node's client and through the file system's aggregate bandwidth (two queues,
crossed at once: the slower decides), the write to local storage and the
prefetcher's CPU. A fetch from a peer takes a round trip per file and the
node's link. A reader reads its step from local storage (one queue a node,
at ``node.local_mbps``). Every CPU burst holds one of the node's cores (of
the host's, for emulated nodes).

Where fewer nodes are tracked than run, only the tracked ones are simulated
in time: each stands for the nodes that read as it does (``Demand.of``),
which ask the shared file system for the same at the same moments, so its
reads hold the metadata queue and the aggregate bandwidth as long as all of
theirs would together (their weight), and its waits count once per node it
stands for. The events then grow with the tracked nodes, not the job's.

The stages begin ``node.startup_s`` into the job (the processes' start;
the first epoch counts it), except ``direct`` reading. An open's latency
is the profile's at the simulated time it starts
(``filesystem.open_ms_changes``). With ``staging.prefetchers: auto`` each
node's pool is resized by the engine's own tuner, fed in simulated time:
where it tunes the files in flight too (``dataset.requests_in_flight:
auto``), its decisions are split threads first, as the engine splits them
(``perf.split_slots``: a process is added only where the prefetchers were
busy on their own CPU with cores to spare).
"""

import numpy as np
import simpy

from .log import Log
from .resources import Cores, Fetchers, SharedFS, hold, split_chunks
from ..engine.node.dispatch import AUTO_TASKS
from ..engine.perf import split_slots
from ..engine.perf.start import PROCESS_BUSY
from ..engine.perf.tune import CORES_FULL
from ..engine.tuning.deepening import Deepening


class Job:
    """Every node and rank of one simulated job.

    Args:
        profile: A ``Profile``.
        demand: A ``demand.Demand``.
        prefetchers: Prefetcher processes per node (with ``tuner``, at start).
        readers: Readers per rank.
        ahead: Steps the service is asked for past the slowest rank of the node.
        read_ahead: Steps decoded past a rank's position.
        compute_s: The training step.
        tuner: For ``staging.prefetchers: auto``, a callable returning a new
            ``engine.perf.Tuner`` for one node's pool: the engine's controller,
            replayed in simulated time; None: fixed prefetchers.
        in_flight: Files each prefetcher fetches at once, in threads (at start).
        threads: With ``tuner``, ``(most_in_flight, most_processes)`` where
            the tuner sizes the files in flight (processes x threads, as
            ``autocounts.PoolResizer`` with ``threads``); None: it sizes the
            processes.
        deepest: For ``staging.lookahead: auto``, the deepest ``ahead`` may
            grow to (``engine.tuning.deepening``); None: ``ahead`` is fixed.
        every_node: Simulate every node in time, not only the tracked ones
            standing for the others (the same figures where every node is
            tracked; slower, for checking the weighted model).
    """

    def __init__(self, profile, demand, prefetchers, readers, ahead, read_ahead, compute_s, tuner=None,
                 deepest=None, every_node=False, in_flight=1, threads=None):
        self.env = env = simpy.Environment()
        self.demand = demand
        tracked = len(demand.tracked)
        if every_node or tracked >= demand.nodes or profile.node.shared_host:  # one host's cores: all in time
            self.weights = [1] * demand.nodes
        else:
            self.weights = np.bincount(np.arange(demand.nodes) % tracked, minlength=tracked).tolist()
        self.nodes = nodes = len(self.weights)
        self.prefetchers, self.readers, self.in_flight = prefetchers, readers, in_flight
        self.tuner, self.threads = tuner, threads
        # (seconds, prefetchers, files in flight each) per node
        self.timelines = [[(0.0, prefetchers, in_flight)] for _ in range(nodes)]
        self.ahead, self.read_ahead, self.compute_s = ahead, read_ahead, compute_s
        self.deepening = [Deepening(ahead, deepest, None) if deepest and deepest > ahead else None
                          for _ in range(nodes)]
        self.depths = [[(0.0, ahead)] for _ in range(nodes)]  # (seconds, look-ahead) per node
        self.steps = len(demand.epochs)
        self.log = Log(nodes * demand.ranks_per_node, demand.epochs, np.repeat(self.weights, demand.ranks_per_node))
        self.fs = SharedFS(env, profile.filesystem, self.log)
        c = profile.costs
        self.copy_s = profile.node.copy_ms(c, demand.nodes) / 1e3
        self.read_s, self.batch_s, self.main_s = c.read_ms / 1e3, c.batch_ms / 1e3, c.main_ms / 1e3
        host = Cores(env, profile.node.cores) if profile.node.shared_host else None
        self.cores = [host or Cores(env, profile.node.cores) for _ in range(nodes)]
        self.startup_s = profile.node.startup_s
        self.progress = None
        self.disk_byte_s = 1.0 / (profile.node.local_mbps * 1e6) if profile.node.local_mbps else 0.0
        self.disks = [simpy.Resource(env, 1) for _ in range(nodes)]
        net = profile.network
        self.peer_s, self.peer_byte_s = net.latency_ms / 1e3, (1.0 / (net.node_mbps * 1e6) if net.node_mbps else 0.0)
        rpn = demand.ranks_per_node
        self.consumed = [[env.event() for _ in range(self.steps)] for _ in range(nodes * rpn)]

    def run(self, mode="staged", dataset=(0, 0), progress=None):
        """Simulates the job.

        Args:
            mode: ``staged`` (the pipeline), ``direct`` (every rank's readers
                open the source, as ``DataLoader`` workers do) or ``stage-all``
                (each node copies the whole dataset first, then reads locally).
            dataset: ``(files, bytes)`` of the whole dataset, for ``stage-all``.
            progress: A ``progress.Progress`` told of the first rank's steps, or None.

        Returns:
            The ``Log`` of what happened.
        """
        self.progress = progress
        rpn = self.demand.ranks_per_node
        # stager's stages start before the first request; DataLoader's workers are not modelled.
        start = self.startup_s if mode != "direct" else 0.0
        for node in range(self.nodes):
            link = simpy.Resource(self.env, 1)
            ready = None
            if mode != "direct":
                ready = [self.env.event() for _ in range(self.steps)]
                body = self._service(node, link, ready) if mode == "staged" else self._stage_all(node, link, ready,
                                                                                                  *dataset)
                self.env.process(self._started(start, body))
            for rank in range(node * rpn, (node + 1) * rpn):
                decoded = [self.env.event() for _ in range(self.steps)]
                self.env.process(self._started(start, self._dispatch(node, rank, link, ready, decoded)))
                self.env.process(self._started(start, self._rank(node, rank, decoded)))
        self.env.run()
        return self.log

    def _started(self, start, body):
        """``body`` once the job has started (``start`` seconds in)."""
        if start:
            yield self.env.timeout(start)
        yield self.env.process(body)

    def _after(self, ranks, step):
        """An event once every rank of ``ranks`` has consumed ``step`` (immediately for a step before 0)."""
        if step < 0:
            return None
        return self.env.all_of([self.consumed[r][step] for r in ranks])

    def _service(self, node, link, ready):
        env, rpn = self.env, self.demand.ranks_per_node
        d = self.demand.of(node)
        fetchers = Fetchers(env, self.prefetchers, self.in_flight)
        tuner = self.tuner() if self.tuner is not None else None
        if tuner is not None:
            env.process(self._control(node, fetchers, tuner, ready))
        peer_threads = simpy.Resource(env, self.prefetchers)
        ranks = range(node * rpn, (node + 1) * rpn)
        deep = self.deepening[node]
        for s in range(self.steps):
            gate = self._after(ranks, s - (self.ahead if deep is None else deep.depth))
            if gate is not None:
                yield gate
            # One chunk a file in flight (an auto pool's at least AUTO_TASKS: it may grow before they are
            # taken). The engine's tasks tuned in threads hold more files, fetched at once all the same.
            chunks = split_chunks(d.source_files[s], d.source_bytes[s],
                                  fetchers.size if tuner is None else max(fetchers.size, AUTO_TASKS))
            if tuner is not None:
                tuner.asked(int(d.source_files[s]), env.now)
            jobs = [env.process(self._fetch(node, fetchers, link, f, b, tuner)) for f, b in chunks]
            jobs += [env.process(self._peer(node, peer_threads, f, b))
                     for f, b in split_chunks(d.peer_files[s], d.peer_bytes[s], self.prefetchers)]
            if jobs:
                env.process(self._when_all(jobs, ready[s], deep, fetchers.slots))
            else:
                ready[s].succeed()

    def _control(self, node, fetchers, tuner, ready):
        """The engine's ``auto`` controller (``autocounts.PoolResizer``) in simulated time.

        It is fed what the engine feeds it (files asked, each task's files,
        wall, CPU and core-queue seconds) and the node's cores' load over its
        window, and is asked as often as the service's loop would ask it.
        """
        env, cores = self.env, self.cores[node]
        mark = (env.now, cores.busy_s)
        while not ready[-1].triggered:
            yield env.timeout(tuner.window_s / 4)
            if not tuner.due(env.now):
                continue
            elapsed = env.now - mark[0]
            cores_busy = min(1.0, (cores.busy_s - mark[1]) / (elapsed * cores.count)) if elapsed > 0 else None
            mark = (env.now, cores.busy_s)
            cpu_s = tuner.window()[1]
            processes = fetchers.processes.size
            # As the engine's resizer: the prefetchers busy on their own CPU, cores to spare.
            cpu_bound = (self.threads is not None and cpu_s is not None and elapsed > 0 and cores_busy is not None
                         and cores_busy < CORES_FULL and cpu_s / elapsed / processes >= PROCESS_BUSY)
            decision = tuner.decide(env.now, cores_busy)
            if decision is None or decision.count == fetchers.size:
                continue
            if self.threads is None:
                processes, in_flight = decision.count, 1
            else:
                most_in_flight, most_processes = self.threads
                growing = decision.count > fetchers.size
                processes, in_flight = split_slots(decision.count, processes, cpu_bound and growing, most_in_flight,
                                                   most_processes)
            if (processes, in_flight) == (fetchers.processes.size, fetchers.in_flight):
                tuner.count = fetchers.size
                continue
            fetchers.resize(processes, in_flight)
            tuner.count = fetchers.size
            tuner.restart(env.now)
            self.timelines[node].append((env.now, processes, in_flight))

    def _stage_all(self, node, link, ready, files, nbytes):
        env = self.env
        fetchers = Fetchers(env, self.prefetchers, self.in_flight)
        # In aggregate: each file in flight's share in a few chunks, not file by file.
        jobs = [env.process(self._fetch(node, fetchers, link, f, b))
                for f, b in split_chunks(files, nbytes, 8 * fetchers.size)]
        yield env.all_of(jobs)
        for event in ready:
            event.succeed()

    def _when_all(self, jobs, event, deep=None, pool=None):
        """``event`` once ``jobs`` are done; ``deep`` hears how long the longest took and whether ``pool`` idles."""
        done = yield self.env.all_of(jobs)
        if deep is not None:
            spare = bool(pool.store.items) and not pool.store.get_queue
            deep.staged(max((v or 0.0) for v in done.values()), spare)
        event.succeed()

    def _local(self, node, nbytes):
        """Reads or writes ``nbytes`` on the node's local storage."""
        if self.disk_byte_s and nbytes:
            yield self.env.process(hold(self.env, self.disks[node], nbytes * self.disk_byte_s))

    def _fetch(self, node, fetchers, link, files, nbytes, tuner=None):
        env = self.env
        slot = yield fetchers.slots.store.get()
        begin = env.now
        yield env.process(self.fs.read(link, files, nbytes, self.weights[node]))
        yield env.process(self._local(node, nbytes))
        process = yield fetchers.processes.store.get()
        queued = yield env.process(self.cores[node].run(files * self.copy_s))
        yield fetchers.processes.store.put(process)
        yield fetchers.slots.store.put(slot)
        if tuner is not None:
            # With the run queue's delay, as the engine's prefetchers read it (``perf.clock``).
            tuner.finished(files, env.now - begin, files * self.copy_s, queued)
        return env.now - begin

    def _peer(self, node, threads, files, nbytes):
        with threads.request() as req:
            yield req
            yield self.env.timeout(files * self.peer_s + nbytes * self.peer_byte_s)
            yield self.env.process(self._local(node, nbytes))
            yield self.env.process(self.cores[node].run(files * self.copy_s))

    def _dispatch(self, node, rank, link, ready, decoded):
        env = self.env
        pool = simpy.Resource(env, self.readers)
        coordinator = simpy.Resource(env, 1)
        d = self.demand.of(node)
        share = self.demand.ranks_per_node
        for s in range(self.steps):
            if ready is not None:
                yield ready[s]
            gate = self._after((rank,), s - self.read_ahead)
            if gate is not None:
                yield gate
            samples = int(d.samples[s])
            nbytes = int((d.source_bytes[s] + d.peer_bytes[s] + d.local_bytes[s]) // max(1, share))  # this rank's
            if ready is None:  # reading the source directly
                env.process(self._read(node, pool, coordinator, samples, decoded[s],
                                        (link, samples, nbytes, self.weights[node])))
            else:
                env.process(self._read(node, pool, coordinator, samples, decoded[s], nbytes=nbytes))

    def _read(self, node, pool, coordinator, samples, done, direct=None, nbytes=0):
        """A reader decodes one step: ``nbytes`` from local storage, or from the source when ``direct`` is
        ``(link, files, bytes, weight)``."""
        with pool.request() as req:
            yield req
            if direct is not None:
                yield self.env.process(self.fs.read(*direct))
            else:
                yield self.env.process(self._local(node, nbytes))
            yield self.env.process(self.cores[node].run(samples * self.read_s + self.batch_s))
        with coordinator.request() as req:
            yield req
            yield self.env.process(self.cores[node].run(samples * self.main_s))
        done.succeed()

    def _rank(self, node, rank, decoded):
        env = self.env
        for s in range(self.steps):
            begin = env.now
            yield decoded[s]
            self.log.wait(rank, s, env.now - begin)
            deep = self.deepening[node]
            if deep is not None and rank == node * self.demand.ranks_per_node:
                depth = deep.depth
                if deep.consumed(env.now, env.now - begin) != depth:
                    self.depths[node].append((env.now, deep.depth))
            if self.compute_s:
                yield env.timeout(self.compute_s)
            self.log.step(rank, s, env.now)
            self.consumed[rank][s].succeed()
            if rank == 0 and self.progress is not None:
                self.progress.update(f"simulating {self.nodes:,} nodes in time", s + 1, self.steps, "step")
