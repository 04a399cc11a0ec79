"""The files and labels a DALI file reader would read, as a dataset stager can stage.

``fn.readers.file`` takes its samples in one of three ways, and so does
``iterators.dali.reader``, with the same result:

- ``file_root`` alone: every subdirectory of it (symbolic links followed,
  ``dir_filters`` applied) in byte order is one label, counted from 0 in
  that order, empty ones included; its files are the entries directly
  inside it that match one of ``file_filters`` (case-insensitive unless
  ``case_sensitive_filter``), in byte order;
- ``files`` (relative to ``file_root`` when given), with ``labels`` or
  else each file's place in the list;
- ``file_list``: a text file of ``name label`` lines, names relative to
  ``file_root`` or else to the list's own directory.

``EncodedFiles`` is a dataset of stager's protocol (``_torch_datasets``):
each sample is the file's bytes as a one-dimensional ``uint8`` array and its
label as an ``int32`` array of shape ``(1,)``, as DALI's reader gives them.
"""

import fnmatch
import os

import numpy as np

# fn.readers.file's default file_filters (DALI 2.4).
FILE_FILTERS = ("*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm", "*.pgm", "*.pbm", "*.jp2",
                "*.webp", "*.flac", "*.ogg", "*.wav")


def _patterns(value, name):
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{name} must be a glob string or a list of them, not {value!r}")


def _matcher(patterns, case_sensitive):
    if case_sensitive:
        return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)
    folded = [p.lower() for p in patterns]
    return lambda name: any(fnmatch.fnmatchcase(name.lower(), p) for p in folded)


def _listing(path, what):
    """``(name, is a directory)`` of each entry, by name. The directory entries' types answer: no ``stat`` of
    each file on the shared file system (the catalog's one ``stat`` a file follows), only of symbolic links."""
    try:
        with os.scandir(path) as entries:
            return sorted((entry.name, entry.is_dir()) for entry in entries)
    except OSError as exc:
        raise FileNotFoundError(f"{what}: cannot list {path}: {exc.strerror}") from None


def tree(file_root, file_filters=FILE_FILTERS, dir_filters=None, case_sensitive_filter=False):
    """The files under ``file_root``'s subdirectories and their labels, as ``fn.readers.file`` lists them.

    Returns:
        ``(relative paths, labels)``.

    Raises:
        FileNotFoundError: ``file_root`` or one of its subdirectories cannot
            be listed (naming it), or no file matches (naming the filters).
    """
    match_file = _matcher(_patterns(file_filters, "file_filters"), case_sensitive_filter)
    match_dir = (_matcher(_patterns(dir_filters, "dir_filters"), case_sensitive_filter) if dir_filters is not None
                 else (lambda name: True))
    if not os.path.isdir(file_root):
        raise FileNotFoundError(f"file_root {file_root} is not a directory")
    classes = [d for d, is_dir in _listing(file_root, "file_root") if is_dir and match_dir(d)]
    rels, labels = [], []
    for label, d in enumerate(classes):
        for name, is_dir in _listing(os.path.join(file_root, d), f"file_root's subdirectory {d}"):
            if match_file(name) and not is_dir:
                rels.append(f"{d}/{name}")
                labels.append(label)
    if not rels:
        raise FileNotFoundError(f"file_root {file_root}: no file in its {len(classes)} subdirectories matches "
                                f"file_filters {list(_patterns(file_filters, 'file_filters'))}")
    return rels, labels


def listed(file_list, file_root=None):
    """``file_list``'s files and labels: one ``name label`` line each, names relative to ``file_root`` or the list.

    Returns:
        ``(paths, labels)``, the paths absolute.

    Raises:
        FileNotFoundError: The list cannot be read.
        ValueError: A line without a name and an integer label, naming its number.
    """
    base = file_root if file_root is not None else os.path.dirname(os.path.abspath(file_list))
    try:
        with open(file_list, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise FileNotFoundError(f"file_list {file_list}: {exc.strerror}") from None
    paths, labels = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.strip().rsplit(None, 1)
        try:
            name, value = parts[0], int(parts[1])
        except (IndexError, ValueError):
            name, value = None, None
        if not name:
            raise ValueError(f"file_list {file_list} line {number}: expected 'name label', got {line!r}")
        paths.append(os.path.join(base, name))
        labels.append(value)
    if not paths:
        raise ValueError(f"file_list {file_list} names no file")
    return paths, labels


def given(files, labels=None, file_root=None):
    """``files`` (relative to ``file_root`` when given) and their labels (default: their places in the list).

    Raises:
        ValueError: ``labels`` of another length than ``files``, or no file.
    """
    files = [files] if isinstance(files, str) else list(files)
    if not files:
        raise ValueError("files is empty")
    paths = [os.path.join(file_root, f) if file_root is not None else f for f in files]
    if labels is None:
        return paths, list(range(len(paths)))
    labels = [labels] if isinstance(labels, int) else [int(v) for v in labels]
    if len(labels) != len(paths):
        raise ValueError(f"labels has {len(labels)} values for {len(paths)} files")
    return paths, labels


class EncodedFiles:
    """Files read whole, with a label each: a dataset of stager's protocol for ``StagedLoader``.

    Args:
        paths: Each sample's file (absolute, or relative to the working directory).
        labels: Each sample's integer label.
    """

    def __init__(self, paths, labels):
        self.paths = [os.path.abspath(p) for p in paths]
        self.labels = np.asarray(labels, dtype=np.int32).reshape(-1, 1)

    def __len__(self):
        return len(self.paths)

    def stager_path(self, index):
        return self.paths[index]

    def stager_load(self, path, index):
        return np.fromfile(path, dtype=np.uint8), self.labels[index]

    def __getitem__(self, index):
        return self.stager_load(self.paths[index], index)


def collate(samples):
    """A minibatch as DALI's external source takes it: the files' arrays in a list, the labels stacked."""
    return [data for data, _ in samples], np.stack([label for _, label in samples])
