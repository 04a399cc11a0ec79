"""stager and ideal on one ``stager bench`` setting, for comparing two checkouts on the same files.

Reads ``--data`` (an npy dataset, made there by ``stager make-dataset`` if it
has no manifest) through the emulator at 10 ms per open and 500 MB/s, one
epoch as fast as possible: ``ideal`` (an already local copy) and stager with
``--prefetchers`` prefetchers, for each reader count. Uses only names every
version of ``stager.bench.methods`` has, so run it once per checkout, the
checkout first on ``PYTHONPATH`` (not the current directory: ``-m`` would
import from there), alternating, and compare the lines:

    for tree in /path/to/old /path/to/new; do
        PYTHONPATH=$tree .venv/bin/python benchmarks/loaders/stager_vs_ideal.py --data /tmp/npy3200
    done
"""

import argparse
import os
import shutil
import sys
import tempfile

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import stager  # noqa: E402
from stager.bench import methods as m  # noqa: E402
from stager.bench.sweep import default_local_dir  # noqa: E402
from stager.catalog import Catalog  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--samples", type=int, default=3200)
    ap.add_argument("--prefetchers", type=int, default=12)
    ap.add_argument("--readers", default="2,4,8")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.data, MANIFEST)):
        make_dataset(args.data, args.samples, 110_000, classes=10, seed=0, progress=False)
    scratch = tempfile.mkdtemp(prefix="stager-vs-ideal-", dir=default_local_dir(args.data, 3 * args.samples * 110_000))
    tree = os.path.dirname(os.path.dirname(stager.__file__))
    try:
        with SlowFS(args.data, open_ms=10.0, mbps=500.0) as mnt:
            catalog = Catalog.from_manifest(mnt, MANIFEST)
            staged = os.path.join(scratch, "staged")
            os.makedirs(staged)
            m.copy_all(mnt, staged, catalog, args.prefetchers)
            for k in (int(x) for x in args.readers.split(",")):
                local = tempfile.mkdtemp(dir=scratch)
                w = m.Workload(catalog, mnt, local, 32, epochs=1, compute_s=0.0)
                ideal = m.ideal(w, k, staged).wall_s
                mine = m.stager(w, args.prefetchers, k).wall_s
                print(f"{tree}: {args.prefetchers} prefetchers, {k} readers: ideal {ideal:.2f} s, stager "
                      f"{mine:.2f} s, ideal / stager {ideal / mine:.2f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
