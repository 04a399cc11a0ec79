"""A synthetic ImageNet-like dataset: labelled ``.npy`` or JPEG images and a manifest."""

import io
import os

import numpy as np

from .progress import Progress

MANIFEST = "manifest.tsv"
_NPY_HEADER = 128  # numpy's v1 header for a small uint8 array


def sample_shape(nbytes, width=256, channels=3):
    """Shape ``(rows, width, channels)`` of a uint8 image of about ``nbytes`` as ``.npy``."""
    return (max(1, (nbytes - _NPY_HEADER) // (width * channels)), width, channels)


FORMATS = ("npy", "jpeg")
JPEG_BYTES = 115_000  # a 256x256 ImageNet training image, resized, at quality 95
_JPEG_QUALITY = 95


# ImageNet's commonest training image sizes (width x height), in the order a ``mixed`` dataset cycles through.
IMAGENET_SIZES = ((500, 375), (500, 333), (375, 500), (500, 500), (333, 500), (500, 400), (400, 500), (500, 334))


def parse_image_sizes(text):
    """``WxH[,WxH...]`` or ``mixed`` (``IMAGENET_SIZES``) as a tuple of ``(width, height)``.

    Raises:
        ValueError: Naming the part that is not ``WxH`` with both at least 8.
    """
    if text == "mixed":
        return IMAGENET_SIZES
    sizes = []
    for part in text.split(","):
        w, sep, h = part.strip().partition("x")
        if not (sep and w.isdigit() and h.isdigit() and int(w) >= 8 and int(h) >= 8):
            raise ValueError(f"image size {part!r} is not WIDTHxHEIGHT (each at least 8), nor 'mixed'")
        sizes.append((int(w), int(h)))
    return tuple(sizes)


def _jpeg_image(rng, noise, size=(256, 256)):
    # A smooth random picture plus uniform noise: the noise's amplitude sets
    # the file size, the picture gives the decoder real colour to work on.
    from PIL import Image  # deferred: only JPEG datasets need it

    coarse = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    img = np.asarray(coarse.resize(size, Image.BILINEAR)).astype(np.int16)
    img += rng.integers(-noise, noise + 1, img.shape, dtype=np.int16)
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=_JPEG_QUALITY,
                                                                  subsampling=0)
    return out.getvalue()


def _jpeg_noise(nbytes, seed, size=(256, 256)):
    """The noise amplitude whose JPEGs of ``size`` come closest to ``nbytes`` (bisection on a few images)."""
    low, high = 0, 128
    while high - low > 1:
        mid = (low + high) // 2
        if len(_jpeg_image(np.random.default_rng(seed), mid, size)) < nbytes:
            low = mid
        else:
            high = mid
    return high


def make_dataset(root, samples, nbytes=196_736, classes=10, seed=0, progress=True, fmt="npy", sizes=None):
    """Writes ``samples`` random images under ``root`` and a manifest listing them.

    Files go to ``<class>/<index>.npy`` (``.jpg`` for ``fmt="jpeg"``: 256x256
    RGB at quality 95, 4:4:4), the ImageNet layout, and
    ``manifest.tsv`` lists ``path<TAB>label`` in index order. Each file is
    written under a temporary name and renamed, so an interrupted run leaves
    no truncated sample; the manifest is written last, so its presence means
    the dataset is complete.

    Args:
        root: Directory to create the dataset in.
        samples: Number of samples.
        nbytes: Approximate file size (256x256x3 uint8 is 196,736 bytes as
            ``.npy``; a JPEG's noise is set to come close, 115,000 is
            ImageNet-like).
        classes: Number of labels.
        seed: Seed of the content and the labels.
        progress: Show a progress bar.
        fmt: ``npy`` (uint8 arrays) or ``jpeg``.
        sizes: For JPEGs, ``(width, height)`` of each image in turn (the
            first's noise is set so that it comes close to ``nbytes``, the
            others' bytes follow their area); None: 256x256.

    Returns:
        Path of the manifest.
    """
    if samples < 1:
        raise ValueError("samples must be at least 1")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    rng = np.random.default_rng(seed)
    shape = sample_shape(nbytes)
    sizes = tuple(sizes or ((256, 256),))
    noise = _jpeg_noise(nbytes, seed, sizes[0]) if fmt == "jpeg" else 0
    labels = rng.integers(0, classes, size=samples)
    width = len(str(samples - 1))
    bar = Progress(samples, f"making {root}", "files", enabled=progress)
    lines = []
    for i in range(samples):
        rel = f"c{labels[i]:03d}/{i:0{width}d}.{'jpg' if fmt == 'jpeg' else 'npy'}"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".part"
        with open(tmp, "wb") as fh:
            if fmt == "jpeg":
                fh.write(_jpeg_image(rng, noise, sizes[i % len(sizes)]))
            else:
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
