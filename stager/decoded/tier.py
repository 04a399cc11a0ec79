"""The decoded tier of a job's node-local directory: samples kept as their loader returned them.

The node leader makes the tier at start (``create``), with the bytes it may
hold; every reader of every rank on the node then opens it (``DecodedTier.open``)
and, for a loader known to be pure, takes a sample from it where it is kept,
else decodes the sample and keeps it. Readers append records to segment
files of their own (``seg-<n>``, claimed with ``O_EXCL``, so the number of
segments bounds the bytes without any counter shared between processes) and
note where each sample's record lies in one shared index, a file of
``ENTRY`` rows by catalog index, mapped in every reader: a reader of
another rank finds, in a later epoch, the record this one wrote.

Appending to a few large files keeps epoch 1's cost to a write of the
pixels: creating a file a sample costs 0.07 ms on tmpfs but 0.65-0.83 ms on
this project's test machine's ext4.

Jobs of a ``staging.share`` group share one tier in the group's directory
(``create_shared``): the first job whose loader keeps copies makes it, for
its kind of record, and a later job of the same kind reads what the group
kept.
"""

import errno
import json
import os
import shutil
import time
import warnings

import numpy as np

from .records import CorruptRecord, length, pack, unpack

DIR = ".stager-decoded"
META = "meta.json"
INDEX = "index"
ENTRY = np.dtype([("segment", "<u4"), ("length", "<u4"), ("offset", "<u8")])  # segment 0: not kept
SEGMENT_BYTES = 64 << 20
MODES = ("auto", "on", "off")
# ``auto``: a reader reads back its first records as soon as it writes them, and judges after this many
# rebuilds (and again, on the running means, in every later epoch) whether rebuilding beats decoding.
JUDGE_AFTER = 8


def create(job_dir, samples, budget, mode, kind):
    """Makes the tier, empty, in ``job_dir``: room for ``budget`` bytes of records of ``samples`` samples.

    A tier left by an earlier run of a kept directory is removed first: its
    index is of that run's catalog.

    Args:
        kind: What the records hold (``SampleDecoder.decoded_kind``): only
            readers whose decoder gives the same kind use the tier.

    Returns:
        The tier's directory.
    """
    path = os.path.join(job_dir, DIR)
    shutil.rmtree(path, ignore_errors=True)
    _build(path, samples, budget, mode, kind)
    return path


def create_shared(group_dir, samples, budget, mode, kind, why):
    """In a group's directory (``staging.share``): makes the tier unless another job of the group made one.

    The tier is built aside and renamed into place, so a job that loses the
    race leaves the winner's tier whole, and a reader never opens half a
    tier. Each job's node leader calls this as it joins; the group's
    directory, and the tier with it, goes when the group's service ends.

    Args:
        why: The sentence that says how ``budget`` was chosen, kept for the
            jobs that join later (``shared_note``).

    Returns:
        The meta of the tier now in the group's directory, or None where none is.
    """
    path = os.path.join(group_dir, DIR)
    if budget and read_meta(path) is None:
        aside = f"{path}.{os.getpid()}"
        _build(aside, samples, budget, mode, kind, why)
        try:
            os.rename(aside, path)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(aside, ignore_errors=True)  # another job's is there: it is the group's
    return read_meta(path)


def shared_note(meta, kind, why):
    """What a group's job's report says of the tier: ``why`` (its own reason) where the group has none.

    Args:
        meta: ``create_shared``'s result.
        kind: The job's decoder's kind.
    """
    if meta is None:
        return why
    if meta["kind"] != kind:
        return (f"none: the group's decoded copies are another loader's ({meta['kind']}), so this job's samples "
                "are read encoded")
    return f"{meta['why']}; the group's, shared by its jobs"


def _build(path, samples, budget, mode, kind, why=None):
    os.mkdir(path, 0o700)
    segment = min(SEGMENT_BYTES, max(budget // 64, 1 << 20))
    with open(os.path.join(path, INDEX), "wb") as fh:
        fh.truncate(max(samples, 1) * ENTRY.itemsize)  # sparse: zeros, nothing kept
    meta = {"mode": mode, "budget": int(budget), "segment_bytes": int(segment),
            "segments": int(budget // segment), "samples": int(samples), "kind": kind, "why": why}
    tmp = os.path.join(path, META + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(meta, fh)
    os.rename(tmp, os.path.join(path, META))  # readers open a tier only once its meta is whole


def read_meta(path):
    """The meta of the tier at ``path``, or None where there is none (yet)."""
    try:
        with open(os.path.join(path, META)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


class DecodedTier:
    """One reader's view of the tier: where it reads records from, and the segment it appends to.

    Use ``open``. Counts what it did for the reader's reports: ``hits``
    (samples built from a record), ``kept`` (records written),
    ``decode_s``/``decode_n`` (loader calls and their seconds) and
    ``rebuild_s``/``rebuild_n`` (records read back and built). The seconds
    are the reader's CPU (``time.thread_time``): a wall clock would count
    the time other processes held the core, which on a node whose readers
    fill every core is most of it.
    """

    def __init__(self, path, meta):
        self.path = path
        self.mode = meta["mode"]
        self.segment_bytes = meta["segment_bytes"]
        self.segments = meta["segments"]
        self.index = np.memmap(os.path.join(path, INDEX), dtype=ENTRY, mode="r+")
        self.using = self.writing = True
        self.note = None  # why this reader stopped using or writing the tier
        self.hits = self.kept = self.decode_n = self.rebuild_n = 0
        self.decode_s = self.rebuild_s = 0.0
        self._fds = {}
        self._own = None  # (segment number, bytes used) of the segment this reader appends to
        self._next = 0
        self._told = (0, 0, None)

    @classmethod
    def open(cls, root, kind):
        """The tier of the job directory ``root`` for a decoder of ``kind``; None where there is none, or it holds
        another kind (a group's, made by a job of another loader)."""
        if not isinstance(root, str):
            return None
        path = os.path.join(root, DIR)
        meta = read_meta(path)
        if meta is None or meta["mode"] == "off" or meta["segments"] <= 0 or meta["kind"] != kind:
            return None
        return cls(path, meta)

    def load(self, index, path, load):
        """Sample ``index`` as ``load(path)`` returns it: from its record where kept, else decoded (and kept)."""
        if self.using:
            entry = self.index[index]
            if entry["segment"]:
                start = time.thread_time()
                obj = self._read(index, int(entry["segment"]) - 1, int(entry["offset"]), int(entry["length"]), path)
                if obj is not None:
                    self.rebuild_s += time.thread_time() - start
                    self.rebuild_n += 1
                    self.hits += 1
                    self._judge(JUDGE_AFTER * 8)
                    return obj
        start = time.thread_time()
        obj = load(path)
        self.decode_s += time.thread_time() - start
        self.decode_n += 1
        if self.writing:
            self._keep(index, obj)
        return obj

    def _read(self, index, segment, offset, size, path):
        """The object of a record, or None (warned, and forgotten so that it is kept again) where it is unusable."""
        where = os.path.join(self.path, f"seg-{segment}")
        try:
            buf = bytearray(size)
            got = os.preadv(self._fd(segment), [buf], offset)
            if got != size:
                raise CorruptRecord(f"{got} bytes read at byte {offset}, where {size} were written")
            return unpack(buf)
        except (CorruptRecord, OSError) as exc:
            warnings.warn(f"stager: the decoded copy of {path} (sample {index}, in {where} at byte {offset}) is "
                          f"unusable: {exc}; the sample is decoded again from its file", RuntimeWarning)
            self.index[index] = (0, 0, 0)
            return None

    def _keep(self, index, obj):
        buffers = pack(obj)
        if buffers is None:
            return
        size = length(buffers)
        if size > self.segment_bytes:
            return  # larger than a segment: this one sample stays encoded
        if not self._room(size):
            self.writing = False
            self.note = f"the tier's {self.segments} segments of {self.segment_bytes} bytes are full"
            return
        segment, used = self._own
        try:
            written = os.pwritev(self._fd(segment), buffers, used)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            written = -1
        if written != size:
            # A full disk (other jobs, or the encoded copies' room): the samples stay encoded, nothing is lost.
            self.writing = False
            self.note = f"the disk under {self.path} filled while a decoded copy was written"
            return
        self.index[index] = (segment + 1, size, used)
        self._own = (segment, used + size)
        self.kept += 1
        if self.mode == "auto" and self.rebuild_n < JUDGE_AFTER:
            # Read back now: what a later epoch would pay, measured before the tier is filled for nothing.
            start = time.thread_time()
            if self._read(index, segment, used, size, "a copy just written") is not None:
                self.rebuild_s += time.thread_time() - start
                self.rebuild_n += 1
                self._judge(JUDGE_AFTER)

    def _room(self, size):
        """Whether this reader's segment has ``size`` bytes more, claiming a new segment where it must."""
        if self._own is not None and self._own[1] + size <= self.segment_bytes:
            return True
        while self._next < self.segments:
            segment, self._next = self._next, self._next + 1
            try:
                fd = os.open(os.path.join(self.path, f"seg-{segment}"),
                             os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue  # another reader's
            self._fds[segment] = fd
            self._own = (segment, 0)
            return True
        return False

    def _fd(self, segment):
        fd = self._fds.get(segment)
        if fd is None:
            fd = self._fds[segment] = os.open(os.path.join(self.path, f"seg-{segment}"), os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _judge(self, after):
        """With ``auto``: stop using the tier where rebuilding a sample costs this reader more than decoding it."""
        if self.mode != "auto" or self.rebuild_n < after or self.decode_n < JUDGE_AFTER or not self.using:
            return
        rebuild, decode = self.rebuild_s / self.rebuild_n, self.decode_s / self.decode_n
        if rebuild >= decode:
            self.using = self.writing = False
            self.note = (f"reading a decoded copy back took {rebuild * 1e3:.2f} ms a sample against "
                         f"{decode * 1e3:.2f} ms to decode it")

    def progress(self):
        """``(samples built from records, records kept, decoding seconds saved, note)`` since the last call.

        The seconds saved are the samples built times what decoding one
        costs this reader over rebuilding it (its running means); the note
        is why this reader stopped using or writing the tier, once.
        """
        hits, kept = self.hits - self._told[0], self.kept - self._told[1]
        note = self.note if self.note != self._told[2] else None
        self._told = (self.hits, self.kept, self.note)
        saved = 0.0
        if hits and self.decode_n and self.rebuild_n:
            saved = hits * max(0.0, self.decode_s / self.decode_n - self.rebuild_s / self.rebuild_n)
        return hits, kept, saved, note

    def close(self):
        """Closes the segments' descriptors and the index; safe twice."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.index = None
