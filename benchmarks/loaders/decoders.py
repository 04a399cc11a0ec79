"""JPEG decoders side by side: PIL, simplejpeg and (where installed) PyTurboJPEG.

Decodes ``--files`` synthetic 256x256 JPEGs of about 115 KB (``stager
make-dataset --format jpeg``), each from its bytes in memory, to uint8 RGB
HWC, then times turning them into float32 CHW as the ``image`` loader does.
The decoders run interleaved, best of ``--repeat``, so a busy moment hits
every one alike. PyTurboJPEG needs the system's libturbojpeg (Debian
``libturbojpeg0``; PyTurboJPEG 1.x for its 2.x); it is left out where missing.

    .venv/bin/python benchmarks/loaders/decoders.py --files 200 --repeat 5
"""

import argparse
import io
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.formats.images import to_chw  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402


def _decoders():
    from PIL import Image

    def pil(data):
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))

    found = {"PIL": pil}
    try:
        import simplejpeg

        found["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ImportError:
        pass
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG

        turbo = TurboJPEG()
        found["PyTurboJPEG"] = lambda data: turbo.decode(data, pixel_format=TJPF_RGB)
    except (ImportError, OSError, RuntimeError):
        pass  # no libturbojpeg on this machine
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-decoders-")
    try:
        make_dataset(work, args.files, 115_000, seed=0, progress=False, fmt="jpeg")
        with open(os.path.join(work, MANIFEST), encoding="utf-8") as fh:
            blobs = [open(os.path.join(work, line.split("\t")[0]), "rb").read() for line in fh]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    decoders = _decoders()
    reference = [decoders["PIL"](b) for b in blobs[:5]]
    best = {name: float("inf") for name in decoders}
    for _ in range(args.repeat):
        for name, decode in decoders.items():
            begin = time.perf_counter()
            for blob in blobs:
                decode(blob)
            best[name] = min(best[name], (time.perf_counter() - begin) / len(blobs))
    chw = float("inf")
    for _ in range(args.repeat):
        begin = time.perf_counter()
        for img in reference * (len(blobs) // 5):
            to_chw(img)
        chw = min(chw, (time.perf_counter() - begin) / (5 * (len(blobs) // 5)))
    print(f"{len(blobs)} JPEGs, {np.mean([len(b) for b in blobs]) / 1000:.0f} KB on average, best of {args.repeat}")
    print(f"{'decoder':12s} {'ms per image':>12s} {'x PIL':>6s} {'same pixels as PIL':>19s}")
    for name, decode in decoders.items():
        same = all(np.array_equal(decode(b), r) for b, r in zip(blobs, reference))
        print(f"{name:12s} {best[name] * 1e3:12.2f} {best['PIL'] / best[name]:6.2f} {str(same):>19s}")
    print(f"{'to float32 CHW':12s} {chw * 1e3:12.2f}")


if __name__ == "__main__":
    main()
