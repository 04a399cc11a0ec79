"""The ``image`` loader: a JPEG or PNG file to a uint8 HWC or float32 CHW array.

JPEG goes through ``simplejpeg`` (libjpeg-turbo's own API, decoding straight
into a numpy array) where it is installed: on 256x256 images of about
115 KB it decodes in half the time PIL takes, PIL's wheels carrying the same
libjpeg-turbo but paying for its image object and a copy. Its accurate
settings (integer DCT, smooth upsampling) are PIL's too, so both give the
same pixels. PNG, anything else PIL reads, and every JPEG where simplejpeg is
missing or refuses a file go through PIL. Colour images are returned as RGB,
so every sample of a dataset has three channels, whatever its file's mode.

``dataset.layout`` picks the result: ``hwc`` (uint8, as decoded) or ``chw``
(float32 channels first, 0-255, Chainer's ``LabeledImageDataset`` layout),
made contiguous in the same pass that converts it.
"""

import io

import numpy as np

try:
    import simplejpeg
except ImportError:  # PIL alone: slower, the same pixels
    simplejpeg = None

_JPEG_MAGIC = b"\xff\xd8\xff"


def _pil_rgb(data):
    from PIL import Image  # deferred: only image datasets pay for the import

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def decode_rgb(data):
    """The image in ``data`` (a file's bytes) as a uint8 ``(height, width, 3)`` array."""
    if simplejpeg is not None and data[:3] == _JPEG_MAGIC:
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except (ValueError, RuntimeError):
            pass  # a JPEG variant libjpeg-turbo's simple API refuses (CMYK, say): PIL reads it
    return _pil_rgb(data)


def to_chw(hwc):
    """A contiguous float32 ``(channels, height, width)`` copy of a uint8 HWC image."""
    out = np.empty((hwc.shape[2], hwc.shape[0], hwc.shape[1]), dtype=np.float32)
    np.copyto(out, hwc.transpose(2, 0, 1), casting="safe")
    return out


def read_rgb(path, options=None):
    """The JPEG or PNG file at ``path`` as a uint8 HWC array: the pure part of ``load_image`` (its decoded tier).

    Raises:
        ValueError: If the file is not an image PIL can read (naming it).
    """
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return decode_rgb(data)
    except Exception as exc:  # PIL's UnidentifiedImageError and friends, without the path
        raise ValueError(f"{path}: not a readable image: {type(exc).__name__}: {exc}") from exc


def in_layout(hwc, options):
    """A decoded image in ``options['layout']``: as it is (``hwc``), or a float32 CHW copy (``chw``)."""
    return to_chw(hwc) if options.get("layout") == "chw" else hwc


def load_image(path, options):
    """Returns the JPEG or PNG file at ``path`` in ``options['layout']`` (``hwc`` or ``chw``).

    Raises:
        ValueError: If the file is not an image PIL can read (naming it).
    """
    return in_layout(read_rgb(path), options)
