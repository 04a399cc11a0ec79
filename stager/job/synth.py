"""A synthetic ImageNet-like dataset: labelled ``.npy`` images and a manifest."""

import os

import numpy as np

from .progress import Progress

MANIFEST = "manifest.tsv"
_NPY_HEADER = 128  # numpy's v1 header for a small uint8 array


def sample_shape(nbytes, width=256, channels=3):
    """Shape ``(rows, width, channels)`` of a uint8 image of about ``nbytes`` as ``.npy``."""
    return (max(1, (nbytes - _NPY_HEADER) // (width * channels)), width, channels)


def make_dataset(root, samples, nbytes=196_736, classes=10, seed=0, progress=True):
    """Writes ``samples`` random images under ``root`` and a manifest listing them.

    Files go to ``<class>/<index>.npy`` (the ImageNet layout), and
    ``manifest.tsv`` lists ``path<TAB>label`` in index order. Each file is
    written under a temporary name and renamed, so an interrupted run leaves
    no truncated sample; the manifest is written last, so its presence means
    the dataset is complete.

    Args:
        root: Directory to create the dataset in.
        samples: Number of samples.
        nbytes: Approximate file size (256x256x3 uint8 is 196,736 bytes).
        classes: Number of labels.
        seed: Seed of the content and the labels.
        progress: Show a progress bar.

    Returns:
        Path of the manifest.
    """
    if samples < 1:
        raise ValueError("samples must be at least 1")
    rng = np.random.default_rng(seed)
    shape = sample_shape(nbytes)
    labels = rng.integers(0, classes, size=samples)
    width = len(str(samples - 1))
    bar = Progress(samples, f"making {root}", "files", enabled=progress)
    lines = []
    for i in range(samples):
        rel = f"c{labels[i]:03d}/{i:0{width}d}.npy"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".part"
        with open(tmp, "wb") as fh:
            np.save(fh, rng.integers(0, 256, size=shape, dtype=np.uint8))
        os.replace(tmp, path)
        lines.append(f"{rel}\t{labels[i]}\n")
        bar.update()
    bar.close()
    manifest = os.path.join(root, MANIFEST)
    with open(manifest + ".part", "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    os.replace(manifest + ".part", manifest)
    return manifest
