"""What the simulated nodes queue for (SimPy): cores, prefetcher tokens, the shared file system.

``des.Job`` drives these; each is a resource with the engine's rule for it
(a CPU burst holds a core; a task holds a file in flight for its whole
fetch, and a prefetcher process for its copy's CPU; a read goes through the
metadata queue and the bandwidths at once).
"""

import simpy

import numpy as np


class Cores:
    """A node's cores (or a host's, shared): each CPU burst holds one."""

    def __init__(self, env, cores):
        self.env = env
        self.count = max(1, int(round(cores)))
        self.pool = simpy.Resource(env, capacity=self.count)
        self.busy_s = 0.0  # core seconds of the bursts begun so far (the controller's load reading)

    def run(self, seconds):
        """Holds a core for ``seconds``; returns the seconds queued for it first (a run queue's delay)."""
        if seconds <= 0:
            return 0.0
        asked = self.env.now
        with self.pool.request() as req:
            yield req
            queued = self.env.now - asked
            self.busy_s += seconds
            yield self.env.timeout(seconds)
        return queued


class Pool:
    """A node's prefetchers as tokens, so that a replayed ``auto`` controller can resize it.

    A task takes a token for its whole fetch; a shrink takes tokens back as
    they come free (a leaving worker first finishes its task, as in the engine).
    """

    def __init__(self, env, size):
        self.env, self.size = env, size
        self.store = simpy.Store(env)
        self._leaving = []  # retirements asked for and not yet granted
        for token in range(size):
            self.store.put(token)

    def resize(self, size):
        self._leaving = [event for event in self._leaving if not event.triggered]
        for _ in range(self.size, size):
            if self._leaving:
                self._leaving.pop().cancel()  # a worker about to leave stays instead
            else:
                self.store.put(self.size)
        for _ in range(size, self.size):
            self._leaving.append(self.store.get())  # granted when a worker is free; that worker then leaves
        self.size = size


class Fetchers:
    """A node's prefetchers: ``processes``, each keeping ``in_flight`` files in flight in threads.

    A task holds a file in flight (``slots``) for its whole fetch, since a
    thread waiting on the source costs no core; its copy's CPU also holds a
    process (``processes``), since a process's threads share one core's
    worth of it. With one file in flight a process, the two are one pool
    (each task then finds a process free).
    """

    def __init__(self, env, processes, in_flight=1):
        self.in_flight = in_flight
        self.slots = Pool(env, processes * in_flight)
        self.processes = Pool(env, processes)

    @property
    def size(self):
        """Files in flight: processes x threads."""
        return self.slots.size

    def resize(self, processes, in_flight):
        self.processes.resize(processes)
        self.slots.resize(processes * in_flight)
        self.in_flight = in_flight


def hold(env, resource, seconds):
    with resource.request() as req:
        yield req
        yield env.timeout(seconds)


class SharedFS:
    """The shared file system: latency, the metadata queue and the aggregate bandwidth."""

    def __init__(self, env, fs, log):
        self.env, self.fs, self.log = env, fs, log
        free = 1.0 - fs.other_load
        self.op_s = 1.0 / (fs.mds_ops_per_s * free) if fs.mds_ops_per_s else 0.0
        self.byte_s = 1.0 / (fs.aggregate_mbps * 1e6 * free) if fs.aggregate_mbps else 0.0
        self.client_byte_s = 1.0 / (fs.client_mbps * 1e6) if fs.client_mbps else 0.0
        self.mds = simpy.Resource(env, 1)
        self.pipe = simpy.Resource(env, 1)

    def read(self, link, files, nbytes, weight=1):
        """Opens and reads ``files`` files of ``nbytes`` in all, one after the other, through a node's ``link``.

        ``weight``: the nodes doing the same at once that this one stands for
        (they queue at the metadata service and the aggregate bandwidth together).
        """
        env = self.env
        open_s = self.fs.open_ms_at(env.now) / 1e3
        if open_s:
            yield env.timeout(files * open_s)
        if self.op_s:
            yield env.process(hold(env, self.mds, files * self.op_s * weight))
        # Served one after the other, the nodes it stands for would have ended over its last part.
        served = max(files * self.op_s, nbytes * self.byte_s) * (weight - 1)
        transfers = []
        if self.byte_s and nbytes:
            transfers.append(env.process(hold(env, self.pipe, nbytes * self.byte_s * weight)))
        if self.client_byte_s and nbytes:
            transfers.append(env.process(hold(env, link, nbytes * self.client_byte_s)))
        if transfers:
            yield env.all_of(transfers)
        self.log.source(env.now, files * weight, nbytes * weight, env.now - served if served else None)


def split_chunks(files, nbytes, ways):
    """``files`` files of ``nbytes`` split into at most ``ways`` chunks: ``(files, bytes)`` each."""
    files, nbytes = int(files), int(nbytes)
    if files <= 0:
        return []
    ways = min(ways, files)
    counts = np.full(ways, files // ways)
    counts[:files % ways] += 1
    return [(int(c), nbytes * int(c) // files) for c in counts]
