"""One function per way of reading a workload; each returns a ``Result``.

Every method reads the same samples in the same order (the plan's epoch
permutations) and, in the training scenario, sleeps the same simulated
compute per minibatch. On ``.npy`` files the direct loaders decode with
``numpy.load``, as their users would; stager's pipeline (stager,
stage-all-first's reading, ideal) with its ``npy`` loader, which returns the
same arrays. On JPEGs every method decodes with the ``image`` loader to
float32 channel-first arrays (``Workload.layout``), as Chainer's
``LabeledImageDataset`` and most PyTorch transforms do. Times include
starting the method's processes.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import plan as planlib
from ..config import config_from_dict
from ..engine import Pipeline
from ..formats import load_image
from ..sources import PosixSource


@dataclass
class Result:
    """What one run measured.

    Attributes:
        method: ``direct-torch``, ``direct-chainer``, ``stage-all-first``,
            ``stager`` or ``ideal``.
        prefetchers: Parallel copies (stager, stage-all-first), else 0.
        readers: Reader or worker processes.
        wall_s: Elapsed seconds, start-up included.
        stall_s: Seconds the loop waited for data.
        samples: Samples delivered.
        stage_s: Seconds spent copying before reading (stage-all-first).
        first_s: Seconds until the first minibatch arrived: start-up, any
            copying up front, and the first read. ``stall_s`` includes it.
        extra: Method-specific figures.
    """

    method: str
    prefetchers: int
    readers: int
    wall_s: float
    stall_s: float
    samples: int
    stage_s: float = 0.0
    first_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def samples_per_s(self):
        return self.samples / self.wall_s if self.wall_s else 0.0

    def to_dict(self):
        out = asdict(self)
        out["samples_per_s"] = round(self.samples_per_s, 2)
        out["stall_fraction"] = round(self.stall_s / self.wall_s, 4) if self.wall_s else 0.0
        out["stall_after_first_fraction"] = (round((self.stall_s - self.first_s) / self.wall_s, 4)
                                             if self.wall_s else 0.0)
        return out


@dataclass(frozen=True)
class Workload:
    """What every method reads.

    Attributes:
        catalog: The samples (``Catalog``).
        source: Directory to read from (the slow mount).
        local: Node-local scratch directory.
        batch_size: Samples per minibatch.
        epochs: Epochs to read.
        compute_s: Simulated compute per minibatch.
        seed: Permutation seed.
        loader: ``npy`` or ``image`` (JPEGs).
        layout: The ``image`` loader's layout (``dataset.layout``).
    """

    catalog: object
    source: str
    local: str
    batch_size: int
    epochs: int
    compute_s: float
    seed: int = 0
    loader: str = "npy"
    layout: str = "chw"

    def decode(self, path):
        """One sample as the direct loaders decode it."""
        if self.loader == "npy":
            return np.load(path)
        return load_image(path, {"layout": self.layout})

    def orders(self):
        return [planlib.permutation(len(self.catalog), self.seed, e) for e in range(self.epochs)]

    def config(self, **sections):
        base = {"dataset": {"source": self.source, "loader": self.loader, "layout": self.layout},
                "plan": {"batch_size": self.batch_size, "epochs": self.epochs, "seed": self.seed},
                "staging": {"local_dir": self.local}}
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        return config_from_dict(base)


def _loop(batches, compute_s, started=None):
    """Iterates as a training loop would; returns ``(wall, stall, samples, first)``.

    ``started``: when the method began starting its processes, if that was
    before the loop; the start-up then counts as wall time and as stall.
    ``first`` is the wait for the first minibatch, start-up included.
    """
    begin = time.perf_counter()
    stall, samples, first = begin - (started or begin), 0, None
    it = iter(batches)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        stall += time.perf_counter() - t
        if first is None:
            first = stall
        samples += len(batch)
        if compute_s:
            time.sleep(compute_s)
    return time.perf_counter() - (started or begin), stall, samples, first or 0.0


class _FileDataset:
    """A map-style dataset reading one file per sample from the workload's source."""

    def __init__(self, w):
        self.decode = w.decode
        self.root = w.source
        self.paths = w.catalog.paths()
        self.labels = w.catalog.labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.decode(os.path.join(self.root, self.paths[i])), int(self.labels[i])


def direct_torch(w, readers):
    """PyTorch DataLoader with ``readers`` workers reading the source directly."""
    import torch.utils.data as tud

    class Files(_FileDataset, tud.Dataset):
        pass

    order = np.concatenate(w.orders()).tolist()
    loader = tud.DataLoader(Files(w), batch_size=w.batch_size, sampler=order,
                            num_workers=readers, collate_fn=lambda b: b)
    wall, stall, samples, first = _loop(loader, w.compute_s)
    return Result("direct-torch", 0, readers, wall, stall, samples, first_s=first)


def direct_chainer(w, readers):
    """Chainer MultiprocessIterator with ``readers`` processes reading the source directly."""
    import iterators.chainer  # noqa: F401  (prepares the distutils that Chainer 7 imports: first)
    import chainer  # isort: skip

    calls = [0]

    def sampler(current_order, current_position):
        # Chainer asks for the next epoch's order ahead of time, one past the last.
        epoch, calls[0] = calls[0], calls[0] + 1
        return planlib.permutation(len(w.catalog), w.seed, epoch)

    dataset = _FileDataset(w)
    started = time.perf_counter()
    it = chainer.iterators.MultiprocessIterator(dataset, w.batch_size, repeat=True, order_sampler=sampler,
                                                n_processes=readers)
    steps = w.epochs * planlib.steps_per_epoch(len(w.catalog), w.batch_size, False)

    def batches():
        for _ in range(steps):
            yield it.next()

    try:
        wall, stall, samples, first = _loop(batches(), w.compute_s, started)
    finally:
        it.finalize()
    return Result("direct-chainer", 0, readers, wall, stall, samples, first_s=first)


def copy_all(source, dest, catalog, copiers):
    """Copies every file with ``copiers`` threads; returns seconds."""
    begin = time.perf_counter()
    with ThreadPoolExecutor(copiers) as pool:
        src = PosixSource(source)
        list(pool.map(lambda i: src.fetch(catalog.path(i), int(catalog.sizes[i]), None, dest),
                      range(len(catalog))))
    return time.perf_counter() - begin


def _read_local(w, root, readers):
    cfg = w.config(dataset={"source": root}, staging={"enabled": False}, reader={"workers": readers})
    started = time.perf_counter()
    with Pipeline(cfg, w.catalog.rooted(root)) as pipe:
        return _loop((b.samples for b in pipe), w.compute_s, started)


def stage_all_first(w, prefetchers, readers, dest):
    """Copies the whole dataset with ``prefetchers`` threads, then reads it locally."""
    begin = time.perf_counter()
    copy_s = copy_all(w.source, dest, w.catalog, prefetchers)
    _, stall, samples, first = _read_local(w, dest, readers)
    wall = time.perf_counter() - begin
    return Result("stage-all-first", prefetchers, readers, wall, stall + copy_s, samples, stage_s=copy_s,
                  first_s=first + copy_s)


def ideal(w, readers, staged):
    """Reads a copy that is already local: the floor."""
    wall, stall, samples, first = _read_local(w, staged, readers)
    return Result("ideal", 0, readers, wall, stall, samples, first_s=first)


def stager(w, prefetchers, readers, **staging):
    """stager: ``prefetchers`` prefetchers staging ahead, ``readers`` readers.

    ``staging``: further ``staging`` config values (e.g. ``files_per_task``).
    """
    cfg = w.config(staging={"prefetchers": prefetchers, "lookahead": max(16, 2 * prefetchers), **staging},
                   reader={"workers": readers})
    started = time.perf_counter()
    with Pipeline(cfg, w.catalog) as pipe:
        wall, stall, samples, first = _loop((b.samples for b in pipe), w.compute_s, started)
        stats = pipe.stats
    return Result("stager", prefetchers, readers, wall, stall, samples, first_s=first,
                  extra={"prefetch_busy_s": round(stats.prefetch_s, 3), "read_busy_s": round(stats.read_s, 3),
                         "files_staged": stats.files_staged})


METHODS = {"direct-torch": direct_torch, "direct-chainer": direct_chainer, "stage-all-first": stage_all_first,
           "stager": stager, "ideal": ideal}
