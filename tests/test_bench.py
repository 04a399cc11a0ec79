"""``stager bench --quick``: every method runs, the outputs are written, and
no method beats the bound (speed itself is never asserted here)."""

import json
import os
import subprocess

import pytest

from conftest import stager_cmd

pytest.importorskip("matplotlib", reason="matplotlib is not installed (extra 'bench')")


def test_quick_bench_measures_every_method_and_writes_its_outputs(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nKept text.\n")
    work = tmp_path / "tmp"
    work.mkdir()
    proc = subprocess.run(stager_cmd("bench", "--quick", "--json", str(tmp_path / "b.json"), "--plots",
                                     str(tmp_path), "--markdown", str(doc)),
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, TMPDIR=str(work)))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "b.json").read_text())
    methods = {(r["method"], r["prefetchers"], r["readers"]) for r in result["throughput"]}
    assert methods == {("ideal", 0, 2), ("direct-torch", 0, 2), ("direct-chainer", 0, 2), ("stager", 2, 2),
                       ("stager", 4, 2), ("stage-all-first", 2, 2), ("stage-all-first", 4, 2)}
    for r in result["throughput"]:
        assert r["samples"] == result["files"] == 64
        if r["method"] != "ideal":
            assert r["efficiency"] <= 1.001, f"{r['method']} beat the bound: {r}"
    assert [r["method"] for r in result["training"]] == ["ideal", "direct-torch", "direct-chainer",
                                                         "stage-all-first", "stager"]
    assert all(r["samples"] == 2 * 64 for r in result["training"])
    assert result["local_copy"]["cp_r_files_per_s"] > 0
    for name in ("bench-throughput.png", "bench-breakdown.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nKept text.\n") and "| stager | 4 | 2 |" in text
    assert os.listdir(work) == [], "the benchmark must remove its data and mounts"


def test_quick_jpeg_bench_reports_cpu_per_process_kind_beside_the_npy_block(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- stager bench: start -->\nnpy tables\n<!-- stager bench: end -->\n")
    work = tmp_path / "tmp"
    work.mkdir()
    proc = subprocess.run(stager_cmd("bench", "--quick", "--format", "jpeg", "--no-chainer", "--json",
                                     str(tmp_path / "b.json"), "--markdown", str(doc)),
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, TMPDIR=str(work)))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["settings"]["format"] == "jpeg"
    for r in result["throughput"] + result["training"]:
        assert set(r["cpu_s"]) == {"rank", "readers", "prefetchers", "emulator"}
        # Every run did work somewhere (a tiny quick run may round one kind's CPU to 0 clock ticks).
        assert sum(r["cpu_s"].values()) > 0 and min(r["cpu_s"].values()) >= 0, r
        assert r["method"] == "stager" or r["cpu_s"]["prefetchers"] == 0, r
    text = doc.read_text()
    assert "npy tables" in text, "the npy block must stay"
    assert "<!-- stager bench jpeg: start -->" in text and "image` loader" in text
    assert os.listdir(work) == []
