"""Decoded samples from readers to the consumer: JPEGs end to end, kept samples, tensors, stopping."""

import logging
import os

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import load_catalog, make_config, stager_workers

from iterators.pytorch import StagedLoader
from stager import plan
from stager.engine import Pipeline
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS


@pytest.fixture(scope="module")
def jpeg_source(tmp_path_factory):
    """40 synthetic 256x256 JPEGs behind the real FUSE emulator (1 ms per open)."""
    root = str(tmp_path_factory.mktemp("jpeg") / "data")
    make_dataset(root, 40, 20_000, classes=3, seed=2, progress=False, fmt="jpeg")
    mnt = str(tmp_path_factory.mktemp("jpeg-mnt"))
    with SlowFS(root, mnt, open_ms=1.0, mbps=0) as mounted:
        yield root, mounted


def _pil_chw(path):
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB")).transpose(2, 0, 1).astype(np.float32)


def test_jpegs_arrive_decoded_channel_first_in_plan_order_and_kept_samples_stay_intact(jpeg_source, tmp_path):
    root, mnt = jpeg_source
    cfg = make_config(mnt, tmp_path / "local", plan={"batch_size": 4, "epochs": 2},
                      dataset={"loader": "image", "layout": "chw"}, reader={"workers": 3})
    catalog = load_catalog(cfg)
    expected = [m.indices.tolist() for m in plan.iterate(len(catalog), cfg.plan)]
    first, seen = None, []
    with Pipeline(cfg, catalog) as pipe:
        for batch in pipe:
            seen.append(batch.indices.tolist())
            for i, (image, label) in zip(batch.indices, batch.samples):
                assert image.dtype == np.float32 and image.shape == (3, 256, 256) and image.flags.c_contiguous
                assert np.array_equal(image, _pil_chw(os.path.join(root, catalog.path(i))))
                assert label == catalog.label(i)
            if first is None:
                first = batch  # kept while 19 more minibatches go through the same readers
                first.samples[0][0][0, 0, 0] = -1.0  # the consumer's to change
    assert seen == expected
    for j, (i, (image, _)) in enumerate(zip(first.indices, first.samples)):
        want = _pil_chw(os.path.join(root, catalog.path(i)))
        if j == 0:
            want[0, 0, 0] = -1.0
        assert np.array_equal(image, want), "a kept sample changed under a later minibatch"


def tensor_loader(path):
    # Channel-first by a permute: a tensor that is not contiguous.
    return torch.from_numpy(np.load(path).astype(np.float32)).permute(2, 0, 1)


def test_tensors_from_a_custom_loader_arrive_as_equal_tensors(slow_source, dataset, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local")
    catalog = load_catalog(cfg)
    root, _ = dataset
    with Pipeline(cfg, catalog, loader=tensor_loader) as pipe:
        for batch in pipe:
            for i, (tensor, _) in zip(batch.indices, batch.samples):
                assert isinstance(tensor, torch.Tensor)
                assert torch.equal(tensor, tensor_loader(os.path.join(root, catalog.path(i))))


def test_collated_batches_stay_intact_after_the_loader_moves_on(jpeg_source, tmp_path):
    _, mnt = jpeg_source
    cfg = make_config(mnt, tmp_path / "local", plan={"batch_size": 8},
                      dataset={"loader": "image", "layout": "chw"})
    with StagedLoader(cfg) as loader:
        batches = [(images, images.clone()) for images, _ in loader]
    assert len(batches) == 5
    for images, copy in batches:
        assert torch.equal(images, copy)


def big_text_loader(path):
    # Not an array: travels pickled through the pipe, 4 MB a sample, so a
    # minibatch outgrows the 1 MiB pipe and its reader blocks while sending.
    return "x" * (4 << 20)


def test_close_with_every_reader_blocked_on_a_full_pipe_ends_them_without_terminating(
        slow_source, tmp_path, caplog):
    cfg = make_config(slow_source, tmp_path / "local", reader={"workers": 4, "ahead": 8},
                      processes={"shutdown_timeout_s": 60.0})
    pipe = Pipeline(cfg, loader=big_text_loader)
    caplog.set_level(logging.WARNING, logger="stager")
    it = iter(pipe)
    next(it)
    readers = list(pipe._ch.readers.procs)
    assert len(readers) == 4
    pipe.close()
    assert [proc.exitcode for proc in readers] == [0, 0, 0, 0], "a reader was terminated or failed"
    assert "did not stop in time" not in caplog.text
    assert not stager_workers()
