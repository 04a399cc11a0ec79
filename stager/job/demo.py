"""``stager demo``: staged reading against direct reading on the slow file system.

The demo's settings are embedded here so that it runs with no file at hand;
``configs/demo.yaml`` holds the same settings for ``stager run``.
"""

import os
import shutil
import tempfile

from ..config import config_from_dict
from .runner import run_job
from .source import write_synthetic

DEMO = {
    "dataset": {"source": "data", "manifest": "manifest.tsv", "loader": "npy"},
    "synthetic": {"samples": 2048, "bytes": 110_000, "classes": 10, "seed": 0},
    "slowfs": {"enabled": True, "open_ms": 20.0, "mbps": 200.0},
    "plan": {"batch_size": 32, "epochs": 1, "seed": 0, "shuffle": True, "drop_last": False},
    "staging": {"enabled": True},  # the counts are the defaults: chosen at start, followed while running
    "reader": {"workers": 2},
    "run": {"compute_ms": 20.0},
}


def demo_config(workdir):
    """The demo's config with its dataset and staging directory under ``workdir``."""
    cfg = config_from_dict(DEMO, base_dir=workdir)
    return cfg.replace(staging={"local_dir": os.path.join(workdir, "local")})


def run_demo(samples=None, out=print, progress=True):
    """Runs the demo in a temporary directory, removed afterwards.

    Args:
        samples: Overrides the number of synthetic samples.
        out: Where result lines go.
        progress: Show progress bars.

    Returns:
        ``(staged_summary, direct_summary)``.
    """
    workdir = tempfile.mkdtemp(prefix="stager-demo-")
    try:
        cfg = demo_config(workdir)
        if samples:
            cfg = cfg.replace(synthetic={"samples": samples})
        s = cfg.synthetic
        out(f"stager demo: {s.samples} samples of ~{s.bytes // 1000} KB behind an emulated slow file system "
            f"({cfg.slowfs.open_ms:g} ms per open, {cfg.slowfs.mbps:g} MB/s), batch {cfg.plan.batch_size}, "
            f"{cfg.reader.workers} readers, {cfg.run.compute_ms:g} ms simulated compute per step")
        write_synthetic(cfg, progress=progress)  # the demo's own data, in its own directory
        staged = run_job(cfg, progress=progress)
        direct = run_job(cfg.replace(staging={"enabled": False}), progress=progress)
        out("")
        out(f"{'method':<44} {'wall s':>8} {'samples/s':>10} {'stall':>7}")
        start = (staged.get("counts_timeline") or [{}])[0]
        counts = (f"{start['prefetchers']} x {start['in_flight']} in flight" if start else
                  f"{cfg.staging.prefetchers} prefetchers")
        rows = [(f"stager ({counts} + {cfg.reader.workers} readers)", staged),
                (f"direct ({cfg.reader.workers} readers on the slow file system)", direct)]
        for name, r in rows:
            out(f"{name:<44} {r['wall_s']:>8.2f} {r['samples_per_s']:>10.1f} {r['stall_fraction']:>7.1%}")
        out(f"\nstaged reading is {direct['wall_s'] / staged['wall_s']:.2f}x faster than direct reading "
            f"({staged['files_staged']} files, {staged['bytes_staged'] / 1e6:.1f} MB staged)")
        return staged, direct
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
