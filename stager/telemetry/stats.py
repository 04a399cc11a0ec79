"""Timers and totals: where the time went, per minibatch and per run."""

import threading
import time
from dataclasses import dataclass

from . import events as tm


@dataclass
class BatchTimes:
    """Timings of one delivered minibatch, in seconds.

    Attributes:
        stall: How long the consumer waited in ``next()`` for it.
        prefetch: Time prefetchers spent copying its files (0 when all were
            already local).
        read: Time a reader spent decoding it.
    """

    stall: float = 0.0
    prefetch: float = 0.0
    read: float = 0.0


class Stats:
    """Running totals of a pipeline: a view over its ``Telemetry``.

    The totals follow the event stream as it is recorded (a few additions
    per event, under a lock, since the service, coordinator and consumer
    threads all record), so reading them costs nothing.

    Attributes:
        telemetry: The event log behind the view.
        batches: Minibatches delivered.
        samples: Samples delivered.
        stall_s: Total time the consumer waited.
        prefetch_s: Total prefetcher busy time.
        read_s: Total reader busy time.
        files_staged: Files copied to node-local storage.
        bytes_staged: Bytes copied to node-local storage.
        files_present: Files found already staged (a kept directory).
        cache: On the node leader, per epoch: the node cache's ``hits`` (files
            already local or on their way when a minibatch asked for them),
            ``samples_local``/``bytes_local`` (what the readers read from
            those: the samples and their bytes, of a container only the
            samples asked for), ``misses``, ``files_from_source``/``bytes_from_source``,
            ``evictions``/``bytes_evicted``, ``dropped``/``bytes_dropped`` (of
            those, files the job reads again from this copy: its next reader,
            this node or another, reads the source instead), ``peak_bytes``, and with
            ``staging.peers`` ``files_from_peers``/``bytes_from_peers`` (fetched
            from other nodes' copies), ``files_to_peers``/``bytes_to_peers``
            (sent to them; the asking node's epoch), ``files_swapped_out``/
            ``bytes_swapped_out`` (dropped for room and given to the holder
            asked, ``engine.peers.swaps``) and ``files_swapped_in``/
            ``bytes_swapped_in`` (given by another node and kept here).
    """

    def __init__(self):
        self.batches = self.samples = self.files_staged = self.bytes_staged = self.files_present = 0
        self.stall_s = self.prefetch_s = self.read_s = 0.0
        self.cache = {}
        self.group = None  # in a shared group: what this job got from it and gave it
        self.decoded = dict.fromkeys(("samples_from_decoded", "samples_kept", "decoding_saved_s"), 0)
        self.decoded_note = None  # on the node leader: the decoded tier's room, or why it has none
        self.started = time.perf_counter()
        self._lock = threading.Lock()
        self.telemetry = tm.Telemetry(on_event=self._on_event)

    def _on_event(self, kind, a, b, value):
        with self._lock:
            if kind == tm.CONSUMED:
                self.batches += 1
                self.samples += b
                self.stall_s += value
            elif kind == tm.STAGED:
                if b >= 0:  # PRESENT (-2) is a copy found already there; 0 bytes is an empty file copied
                    self.files_staged += 1
                    self.bytes_staged += b
                    epoch = self._epoch(int(value))
                    epoch["files_from_source"] += 1
                    epoch["bytes_from_source"] += b
                else:
                    self.files_present += 1
            elif kind == tm.PEER:
                self.files_staged += 1
                self.bytes_staged += b
                epoch = self._epoch(int(value))
                epoch["files_from_peers"] += 1
                epoch["bytes_from_peers"] += b
            elif kind == tm.SERVED:
                if b:
                    epoch = self._epoch(int(value))
                    epoch["files_to_peers"] += 1
                    epoch["bytes_to_peers"] += b
            elif kind == tm.REQUEST:
                epoch = self._epoch(a)
                epoch["hits"] += b
                epoch["misses"] += int(value)
            elif kind == tm.LOCAL:
                epoch = self._epoch(a)
                epoch["bytes_local"] += b
                epoch["samples_local"] += int(value)
            elif kind == tm.FALLBACK:
                self._epoch(int(value))["files_after_peer"] += 1
            elif kind == tm.EVICTED:
                epoch = self._epoch(int(value))
                epoch["evictions"] += 1
                epoch["bytes_evicted"] += b
            elif kind == tm.DROPPED:
                epoch = self._epoch(int(value))
                epoch["dropped"] += 1
                epoch["bytes_dropped"] += b
            elif kind in (tm.SWAPPED_OUT, tm.SWAPPED_IN):
                epoch = self._epoch(int(value))
                way = "out" if kind == tm.SWAPPED_OUT else "in"
                epoch[f"files_swapped_{way}"] += 1
                epoch[f"bytes_swapped_{way}"] += b
            elif kind == tm.USAGE:
                epoch = self._epoch(a)
                epoch["peak_bytes"] = max(epoch["peak_bytes"], b)
            elif kind == tm.TASK:
                self.prefetch_s += value
            elif kind == tm.READ:
                self.read_s += value
                if self.group is not None:
                    self.group["samples_decoded"] += b
            elif kind == tm.GROUP:
                self._group(a, b, value)
            elif kind == tm.DECODED:
                self.decoded["samples_from_decoded"] += a
                self.decoded["samples_kept"] += b
                self.decoded["decoding_saved_s"] = round(self.decoded["decoding_saved_s"] + value, 4)

    def _group(self, what, count, nbytes):
        if self.group is None:
            self.group = dict.fromkeys(("files_from_group", "bytes_from_group", "files_fetched", "bytes_fetched",
                                        "batches_from_group", "samples_from_group", "batches_published",
                                        "samples_decoded", "decoding_spared_s"), 0)
        group = self.group
        if what == tm.GROUP_FILES:
            group["files_from_group"] += count
            group["bytes_from_group"] += int(nbytes)
        elif what == tm.GROUP_FETCHED:
            group["files_fetched"] += count
            group["bytes_fetched"] += int(nbytes)
            self.files_staged += count  # what this job had copied: the others' share is in files_from_group
            self.bytes_staged += int(nbytes)
        elif what == tm.GROUP_TAKEN:  # ``nbytes`` carries the seconds another job's reader spent decoding it
            group["batches_from_group"] += 1
            group["samples_from_group"] += count
            group["decoding_spared_s"] = round(group["decoding_spared_s"] + nbytes, 4)
        elif what == tm.GROUP_GIVEN:
            group["batches_published"] += 1

    def _epoch(self, epoch):
        if epoch not in self.cache:
            self.cache[epoch] = dict.fromkeys(("hits", "samples_local", "bytes_local", "misses", "files_from_source",
                                               "bytes_from_source", "files_after_peer", "evictions", "bytes_evicted",
                                               "dropped", "bytes_dropped", "peak_bytes", "files_from_peers",
                                               "bytes_from_peers", "files_to_peers", "bytes_to_peers", "files_swapped_out",
                                               "bytes_swapped_out", "files_swapped_in", "bytes_swapped_in"), 0)
        return self.cache[epoch]

    def cache_table(self):
        """The node cache's counters, one dictionary per epoch (node leader; empty elsewhere)."""
        with self._lock:
            return [dict(epoch=e, **self.cache[e]) for e in sorted(self.cache)]

    def summary(self, wall_s=None):
        """Totals as a JSON-ready dictionary, with rates over ``wall_s``."""
        wall = time.perf_counter() - self.started if wall_s is None else wall_s
        with self._lock:
            return {
                "batches": self.batches,
                "samples": self.samples,
                "files_staged": self.files_staged,
                "bytes_staged": self.bytes_staged,
                "files_present": self.files_present,
                "wall_s": round(wall, 4),
                "stall_s": round(self.stall_s, 4),
                "stall_fraction": round(self.stall_s / wall, 4) if wall > 0 else 0.0,
                "samples_per_s": round(self.samples / wall, 2) if wall > 0 else 0.0,
                "prefetch_busy_s": round(self.prefetch_s, 4),
                "read_busy_s": round(self.read_s, 4),
                "cache": [dict(epoch=e, **self.cache[e]) for e in sorted(self.cache)],
                **({"group": dict(self.group)} if self.group is not None else {}),
                "decoded": dict(self.decoded, note=self.decoded_note),
            }
