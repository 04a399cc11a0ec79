"""What ``staging.verify`` costs: one prefetcher's fetches per second in each mode, side by side.

Writes ``--files`` random files of ``--bytes`` each, then fetches them all
with ``PosixSource.fetch`` in each mode (``none``, ``size``, ``xxhash``),
rounds interleaved, best of ``--repeat``, so a busy moment hits every mode
alike. With ``--mbps`` the tree is read through the FUSE emulator at that
bandwidth cap, where ``xxhash``'s second read of every file shows.

    .venv/bin/python benchmarks/stores/verify_cost.py --files 1000 --bytes 100000 --repeat 3
    .venv/bin/python benchmarks/stores/verify_cost.py --files 200 --bytes 100000 --repeat 3 --mbps 50
"""

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.slowfs import SlowFS  # noqa: E402
from stager.sources import PosixSource  # noqa: E402
from stager.sources.verify import MODES  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--bytes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mbps", type=float, default=0.0, help="read through the emulator at this cap (0: directly)")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="stager-verify-")
    try:
        src = os.path.join(base, "src")
        os.makedirs(src)
        names = [f"{i:06d}.bin" for i in range(args.files)]
        for name in names:
            with open(os.path.join(src, name), "wb") as fh:
                fh.write(os.urandom(args.bytes))
        mounted = SlowFS(src, os.path.join(base, "mnt"), open_ms=0, mbps=args.mbps) if args.mbps else None
        if mounted:
            os.mkdir(os.path.join(base, "mnt"))
        with mounted if mounted else contextlib.nullcontext(src) as root:
            best = dict.fromkeys(MODES, float("inf"))
            for r in range(args.repeat):
                for mode in MODES:
                    dst = os.path.join(base, f"dst-{mode}-{r}")
                    source = PosixSource(root, mode)
                    start = time.perf_counter()
                    for name in names:
                        source.fetch(name, args.bytes, None, dst)
                    best[mode] = min(best[mode], time.perf_counter() - start)
                    shutil.rmtree(dst)
        where = f"through the emulator at {args.mbps:g} MB/s" if args.mbps else "from a local tree"
        print(f"{args.files} files of {args.bytes} bytes {where}, best of {args.repeat}:")
        for mode in MODES:
            print(f"  {mode:7s} {args.files / best[mode]:8.0f} files/s  {best[mode] / best['none']:.2f}x the time of none")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
