"""DLIO's training or evaluation files as a dataset stager can stage, and the staging settings of a DLIO run.

DLIO (``dlio_benchmark``) numbers the samples of a file list globally:
sample ``i`` is sample ``i % num_samples_per_file`` of file
``i // num_samples_per_file`` (its ``index`` sampler's map). ``DLIOFiles``
names that file for each sample (``stager_path``) and reads the sample
out of a staged copy (``stager_load``) as DLIO's own readers read it: the
whole array of an npz or npy file, one row of an HDF5 ``records``
dataset, a decoded JPEG or PNG, then DLIO's emulated preprocessing time.
A file of one sample is opened and closed for it (DLIO's ``on_demand``
read type). Files holding many samples are staged once for all of them (a
container), and a reader keeps the one it reads from open while the
samples it is given come from the same copy.
"""

import os
import threading
import time

import numpy as np
import torch
from torch.utils.data import Dataset

CONTAINER_WINDOW = 8  # containers the ``shards`` shuffle mixes when files hold many samples


def _npz(path):
    return np.load(path, allow_pickle=True)["x"]


def _npy(path):
    return np.load(path, allow_pickle=True)


def _hdf5(path):
    import h5py

    return h5py.File(path, "r")


def _image(path):
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image)[..., None]  # the image as its file's only sample


# How each format opens a file, and takes sample ``inner`` out of what was opened.
OPENERS = {"npz": _npz, "npy": _npy, "hdf5": _hdf5, "jpeg": _image, "png": _image}
SAMPLE = {"npz": lambda x, inner: x[..., inner], "npy": lambda x, inner: x[..., inner],
          "hdf5": lambda fh, inner: fh["records"][inner], "jpeg": lambda x, inner: x[..., 0],
          "png": lambda x, inner: x[..., 0]}
FORMATS = tuple(OPENERS)


class DLIOFiles(Dataset):
    """The samples of one DLIO file list, in DLIO's global numbering.

    Args:
        files: DLIO's file list (``file_list_train`` or ``file_list_eval``).
        samples_per_file: ``dataset.num_samples_per_file``.
        format: ``dataset.format`` (one of ``FORMATS``).
        preprocess: ``(mean, stdev)`` of DLIO's emulated preprocessing
            time per sample, in seconds (``reader.preprocess_time``).
        where: What the list is, for errors (``"training"``, ``"evaluation"``).

    Raises:
        ValueError: For a format stager cannot read, or an empty list.
    """

    def __init__(self, files, samples_per_file, format, preprocess=(0.0, 0.0), where="training"):
        if format not in OPENERS:
            raise ValueError(f"iterators.dlio reads DLIO's {', '.join(FORMATS)} formats; the workload's "
                             f"dataset.format is {format!r}: use DLIO's own data loader for it")
        if not files:
            raise ValueError(f"DLIO's {where} file list is empty")
        if int(samples_per_file) < 1:
            raise ValueError(f"dataset.num_samples_per_file must be at least 1, not {samples_per_file!r}")
        self.files = [os.path.abspath(os.fspath(f)) for f in files]
        self.per_file = int(samples_per_file)
        self.format = format
        self.preprocess = (float(preprocess[0]), float(preprocess[1]))
        if self.per_file > 1:
            self.stager_window = CONTAINER_WINDOW  # read as sharded loaders read containers
        self._open = None  # ((pid, path, inode), what OPENERS returned): the last file of many samples

    def __len__(self):
        return len(self.files) * self.per_file

    def stager_path(self, index):
        """The file DLIO's sample ``index`` is in."""
        return self.files[index // self.per_file]

    def stager_load(self, path, index):
        """DLIO's sample ``index`` as a tensor, read from ``path`` (the source's file or its staged copy)."""
        # A file of one sample is opened for it and let go, as DLIO's readers do; so is any file read by a
        # thread other than the process's main one (the probe of ``auto`` decodes a few files in threads).
        if self.per_file == 1 or threading.current_thread() is not threading.main_thread():
            opened = OPENERS[self.format](path)
            try:
                sample = np.ascontiguousarray(SAMPLE[self.format](opened, index % self.per_file))
            finally:
                getattr(opened, "close", lambda: None)()
        else:
            sample = np.ascontiguousarray(SAMPLE[self.format](self._opened(path), index % self.per_file))
        mean, stdev = self.preprocess
        if mean or stdev:
            time.sleep(max(np.random.normal(mean, stdev) if stdev else mean, 0.0))  # as DLIO's readers do
        return torch.from_numpy(sample)

    def _opened(self, path):
        """A file of many samples, kept open (HDF5) or loaded (npz) while a reader takes samples of the same copy.

        DLIO's own readers open the file again for each sample (its
        ``on_demand`` read type); a staged container is read by sharded
        loaders' rule instead. The inode tells a copy made again at the
        same path.
        """
        key = (os.getpid(), path, os.stat(path).st_ino)
        if self._open is None or self._open[0] != key:
            self._close()
            self._open = (key, OPENERS[self.format](path))
        return self._open[1]

    def _close(self):
        # A file opened by another process (the training process's probe, before the readers were forked)
        # is that process's: its descriptor may be closed here already.
        if self._open is not None and self._open[0][0] == os.getpid():
            getattr(self._open[1], "close", lambda: None)()
        self._open = None

    def __getitem__(self, index):
        return self.stager_load(self.stager_path(index), index)

    def __getstate__(self):
        return {**self.__dict__, "_open": None}  # open files stay with the process that opened them


def collate(samples):
    """One batch: samples stacked where their shapes agree (DLIO's ``record_length_stdev`` varies them), else a list."""
    if all(s.shape == samples[0].shape for s in samples):
        # numpy's copy runs on this thread; torch.stack would wake torch's pool of intra-op threads, which on
        # a node whose cores run the readers and prefetchers wait for each other (tens of ms a batch).
        return torch.from_numpy(np.stack([s.numpy() for s in samples]))
    return list(samples)


def workload_section():
    """The ``stager`` section of the running DLIO workload's configuration (``workload.stager``), or None.

    Hydra writes the composed configuration (the workload YAML with the
    command line's overrides) to ``<run dir>/.hydra/config.yaml`` before
    DLIO starts; it is read back from there. Outside a Hydra run, or with
    ``hydra.output_subdir=null``, there is none.
    """
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
    except (ImportError, ValueError):
        return None
    if hydra.output_subdir is None:
        return None
    path = os.path.join(hydra.runtime.output_dir, hydra.output_subdir, "config.yaml")
    if not os.path.exists(path):
        return None
    from omegaconf import OmegaConf

    composed = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    section = (composed.get("workload") or {}).get("stager")
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"{path}: workload.stager must be a mapping of stager's settings, not {section!r}")
    return section
