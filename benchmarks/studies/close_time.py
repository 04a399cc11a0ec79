"""How long ``Pipeline.close()`` takes while every reader holds a minibatch.

Makes a JPEG dataset (256x256, about 115 KB), then ``--closes`` times:
starts a pipeline (12 prefetchers, ``--readers`` readers, 32 samples a
minibatch) whose loader decodes with PIL to float32 channel-first by a
transpose, as a user's loader would (not contiguous: before issue 18 such a
minibatch crossed the pipe pickled, 25 MB), takes the first minibatch, when
the other readers are decoding or sending theirs, and times ``close()``. It
prints the median, 95th percentile and worst close, and how many workers had
to be terminated. It uses only what every version of stager has (a callable
loader), so the same script measures an older checkout on the same files:

    PYTHONPATH=. .venv/bin/python benchmarks/studies/close_time.py --closes 20 --data /tmp/jpegs
    PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/studies/close_time.py --closes 20 --data /tmp/jpegs
"""

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.config import config_from_dict  # noqa: E402
from stager.engine import Pipeline  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402


def pil_chw(path):
    """PIL to float32 CHW by a transpose: what most training scripts do."""
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)


class _Terminations(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += "did not stop in time" in record.getMessage()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--closes", type=int, default=20)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--data", help="the JPEG dataset; made there if it has no manifest yet (default: a "
                                   "temporary one, removed)")
    args = ap.parse_args()
    terminations = _Terminations()
    logging.getLogger("stager").addHandler(terminations)
    work = tempfile.mkdtemp(prefix="stager-close-")
    try:
        data = args.data or os.path.join(work, "data")
        if not os.path.exists(os.path.join(data, MANIFEST)):
            make_dataset(data, args.samples, 115_000, seed=0, progress=False, fmt="jpeg")
        cfg = config_from_dict({"dataset": {"source": data, "manifest": "manifest.tsv"},
                                "plan": {"batch_size": 32, "epochs": 1},
                                "staging": {"local_dir": work, "prefetchers": 12},
                                "reader": {"workers": args.readers}})
        times = []
        for _ in range(args.closes):
            pipe = Pipeline(cfg, loader=pil_chw)
            next(iter(pipe))
            begin = time.perf_counter()
            pipe.close()
            times.append(time.perf_counter() - begin)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    times.sort()
    p95 = times[min(len(times) - 1, int(np.ceil(0.95 * len(times))) - 1)]
    import stager
    print(f"{os.path.dirname(os.path.dirname(stager.__file__))}: {args.readers} readers, {len(times)} closes: "
          f"median {times[len(times) // 2]:.3f} s, p95 {p95:.3f} s, worst {times[-1]:.3f} s, "
          f"{terminations.count} workers terminated")


if __name__ == "__main__":
    main()
