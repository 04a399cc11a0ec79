"""Chainer datasets that read one file per example, as stager's catalog and loader.

``LabeledImageDataset`` and ``ImageDataset`` keep the example files' paths
(``_pairs`` or ``_paths``) relative to a root (``_root``), and so does any
dataset written the same way; ``TransformDataset`` and ``SubDataset`` (from
``split_dataset``) may wrap them. stager stages those files, and its reader
processes decode a staged file with the dataset's own ``get_example`` on a
shallow copy whose root and single path point at the staged file, then apply
the wrappers' transforms: an example comes out as the dataset itself would
return it. Anything else holds its examples in memory (a list,
``TupleDataset``) or reads them some other way (zipped datasets), and is
refused.
"""

import copy
import os
import stat

import numpy

from stager import Catalog
from stager.formats import SampleDecoder
from stager.sources import check_relpath, reading

from ._chainer_import import chainer as _chainer


def _refusal(dataset):
    return TypeError(
        f"StagingIterator stages files, so its dataset must read each example from a file: a stager Config "
        f"(or dict of its values) or Catalog, or a Chainer dataset that keeps its file paths and root as "
        f"LabeledImageDataset and ImageDataset do (also inside TransformDataset or SubDataset). "
        f"{type(dataset).__name__} holds its examples in memory or reads them another way: iterate it with "
        f"chainer.iterators.MultiprocessIterator (or SerialIterator) instead.")


def _leaf_kind(dataset):
    """``"pairs"`` or ``"paths"`` for a dataset that reads files under ``_root``, else None."""
    if not isinstance(getattr(dataset, "_root", None), str) or not callable(getattr(dataset, "get_example", None)):
        return None
    pairs = getattr(dataset, "_pairs", None)
    if isinstance(pairs, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2
                                                and isinstance(p[0], str) for p in pairs):
        return "pairs"
    paths = getattr(dataset, "_paths", None)
    if isinstance(paths, (list, tuple)) and all(isinstance(p, str) for p in paths):
        return "paths"
    return None


def _same_label(a, b):
    return a is b or numpy.array_equal(numpy.asarray(a), numpy.asarray(b))


class FileDataset:
    """What stager needs from a file-backed Chainer dataset.

    Args:
        dataset: The dataset the user gave the iterator.

    Raises:
        TypeError: If it does not read its examples from files (see module).
        ValueError: If one file is listed with two different labels.
    """

    def __init__(self, dataset):
        self.name = type(dataset).__name__
        leaf, transforms, indices = dataset, [], None
        while True:
            if isinstance(leaf, _chainer.datasets.TransformDataset):
                transforms.append(leaf._transform)
                leaf = leaf._dataset
            elif isinstance(leaf, _chainer.datasets.SubDataset):
                # An index of the wrapper -> an index of the dataset it wraps.
                inner = range(leaf._start, leaf._finish)
                if leaf._order is not None:
                    inner = [int(leaf._order[j]) for j in inner]
                indices = list(inner) if indices is None else [inner[j] for j in indices]
                leaf = leaf._dataset
            else:
                break
        self.kind = _leaf_kind(leaf)
        if self.kind is None:
            raise _refusal(dataset)
        entries = leaf._pairs if self.kind == "pairs" else leaf._paths
        if indices is None:
            indices = range(len(entries))
        given = [entries[j][0] if self.kind == "pairs" else entries[j] for j in indices]
        top = os.path.abspath(leaf._root)
        full = [os.path.normpath(os.path.join(top, p)) for p in given]
        if any(os.path.commonpath([top, f]) != top for f in full):
            # Some paths are absolute or climb out of the root: stage from
            # the deepest directory that holds them all.
            top = os.path.commonpath([os.path.dirname(f) for f in full])
        self.root = top
        self.rels = [check_relpath(os.path.relpath(f, top), f"{self.name} example {i}") for i, f in enumerate(full)]
        self.labels = None
        if self.kind == "pairs":
            self.labels = {}
            for rel, j in zip(self.rels, indices):
                label = entries[j][1]
                if rel in self.labels and not _same_label(self.labels[rel], label):
                    raise ValueError(f"{self.name}: file {rel} is listed with labels {self.labels[rel]!r} and "
                                     f"{label!r}; stager decodes each staged file once, so a file needs one label")
                self.labels.setdefault(rel, label)
        # The decoder needs the dataset's settings (dtype, label dtype), not its list of files.
        self.template = copy.copy(leaf)
        setattr(self.template, "_pairs" if self.kind == "pairs" else "_paths", [])
        self.transforms = tuple(reversed(transforms))  # innermost first

    def catalog(self):
        """The files as a ``stager.Catalog`` (one ``stat`` per distinct file).

        Raises:
            FileNotFoundError: Naming the first example whose file cannot be read.
        """
        seen, sizes, mtimes = {}, [], []
        for i, rel in enumerate(self.rels):
            if rel not in seen:
                path = os.path.join(self.root, rel)
                try:
                    with reading("stat", path):
                        st = os.stat(path)
                except OSError as exc:
                    raise FileNotFoundError(f"{self.name} example {i}: cannot read {path}: {exc.strerror}") from None
                if not stat.S_ISREG(st.st_mode):
                    raise FileNotFoundError(f"{self.name} example {i}: {path} is not a regular file")
                seen[rel] = st
            sizes.append(seen[rel].st_size)
            mtimes.append(seen[rel].st_mtime_ns)
        return Catalog.from_paths(self.root, self.rels, sizes, None, mtimes)

    def decoder(self):
        """A loader for stager's readers (picklable)."""
        return Decoder(self.template, self.kind, self.labels, self.transforms)


def _pure(template):
    """Whether the dataset reads its images with Chainer's own ``get_example`` (its pixels: the file's alone)."""
    images = _chainer.datasets.image_dataset
    return type(template).get_example in (images.ImageDataset.get_example, images.LabeledImageDataset.get_example)


def _pixels(path):
    """The image file's pixels as PIL gives them to numpy: what Chainer's reading converts to the dataset's dtype."""
    from PIL import Image

    with Image.open(path) as image:
        return numpy.asarray(image)


class Decoder(SampleDecoder):
    """Decodes one staged file as the dataset would decode the example.

    A path is matched to its label by its ending: the longest relative path
    of the dataset that the path ends with (the staging directory, or the
    source when staging is off, is what comes before it).

    With the node's decoded tier (``staging.decoded``) and Chainer's own
    ``ImageDataset`` or ``LabeledImageDataset`` (not a subclass that
    overrides ``get_example``), the tier keeps each image's pixels as PIL
    gives them (uint8 for the usual modes, a quarter of float32's bytes);
    the example is then made from them as Chainer makes it: converted to the
    dataset's dtype, channels first, then the wrappers' transforms.

    Args:
        template: The dataset, with its list of files emptied.
        kind: ``"pairs"`` or ``"paths"``.
        labels: Relative path -> label, for ``"pairs"``.
        transforms: The wrapping ``TransformDataset``s' functions, innermost first.
    """

    def __init__(self, template, kind, labels, transforms):
        self.template = template
        self.kind = kind
        self.labels = labels
        self.transforms = transforms
        self._tier = None

    def keeps_decoded(self):
        return _pure(self.template)

    def decode(self, path, index, epoch):
        if self._tier is None:
            return self(path)
        images = _chainer.datasets.image_dataset
        image = numpy.asarray(self._tier.load(index, path, _pixels), dtype=self.template._dtype)
        example = images._postprocess_image(image)
        if self.kind == "pairs":
            example = example, numpy.array(self._label(path), dtype=self.template._label_dtype)
        for transform in self.transforms:
            example = transform(example)
        return example

    def _label(self, path):
        parts = path.split(os.sep)
        for i in range(1, len(parts)):
            rel = "/".join(parts[i:])
            if rel in self.labels:
                return self.labels[rel]
        raise KeyError(f"{path} is not a file of this dataset")

    def __call__(self, path):
        dataset = copy.copy(self.template)
        dataset._root = ""  # the path is absolute: the dataset joins it to nothing
        if self.kind == "pairs":
            dataset._pairs = [(path, self._label(path))]
        else:
            dataset._paths = [path]
        example = dataset.get_example(0)
        for transform in self.transforms:
            example = transform(example)
        return example
