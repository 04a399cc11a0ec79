"""The built-in decoders, and the wire that carries decoded minibatches."""

import multiprocessing
import os
import struct
import threading

import numpy as np
import pytest

from stager.engine import wire
from stager.formats import load_image, load_npy
from stager.job.synth import make_dataset

ARRAYS = {
    "float32": np.random.default_rng(0).random((3, 4)).astype("<f4"),
    "big_endian": np.arange(7, dtype=">i8"),
    "bool": np.array([True, False, True]),
    "complex": np.array([1 + 2j, -3j]),
    "structured": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "scalar": np.array(5.0),
    "empty": np.zeros((0, 3)),
    "image": np.random.default_rng(1).integers(0, 255, (3, 32, 32), dtype=np.uint8),
    "unicode": np.array(["ab", "c"]),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_loader_equals_numpy_load(tmp_path, name, version):
    path = tmp_path / f"{name}.npy"
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, ARRAYS[name], version=version)
    ours, theirs = load_npy(str(path), {}), np.load(path, allow_pickle=False)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs)
    assert (ours.flags.c_contiguous, ours.flags.f_contiguous) == (theirs.flags.c_contiguous,
                                                                   theirs.flags.f_contiguous)
    assert ours.flags.writeable


def test_npy_loader_names_a_truncated_file(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, ARRAYS["image"])
    os.truncate(path, os.path.getsize(path) - 5)
    with pytest.raises(ValueError, match=r"cut\.npy: truncated \.npy file: 3067 of 3072 data bytes"):
        load_npy(str(path), {})


def test_npy_loader_refuses_pickled_objects_and_other_files(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        load_npy(str(path), {})
    path = tmp_path / "text.npy"
    path.write_bytes(b"not an array at all")
    with pytest.raises(ValueError):
        load_npy(str(path), {})


@pytest.fixture
def channel():
    """A reader's ring and pipe, both ends in this process: ``(ring, receiver, sender)``."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    ring = wire.Ring()
    yield ring, receiver, sender
    ring.close()
    receiver.close()
    sender.close()


def test_wire_carries_arrays_and_objects_intact(channel):
    ring, receiver, sender = channel
    big = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)  # larger than the pipe
    chw = np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8).transpose(2, 0, 1)
    message = ("batch", 7, [big, np.asfortranarray(np.arange(600.0).reshape(20, 30)), chw,
                            ARRAYS["structured"].repeat(100), ARRAYS["unicode"].repeat(200),
                            ARRAYS["image"][:, ::2], (b"raw" * 1000, b"small", 3)])
    thread = threading.Thread(target=ring.send, args=(sender, message))
    thread.start()
    got = ring.recv(receiver)
    thread.join()
    assert got[:2] == ("batch", 7)
    for ours, theirs in zip(got[2][:6], message[2][:6]):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and np.array_equal(ours, theirs)
        assert ours.flags.writeable
    assert got[2][1].flags.f_contiguous and got[2][2].flags.c_contiguous
    assert got[2][6] == (b"raw" * 1000, b"small", 3)


def test_wire_sends_a_channel_first_image_out_of_band(channel):
    # A transposed array is not contiguous; pickle would carry all of it in band.
    ring, receiver, sender = channel
    chw = [np.zeros((256, 256, 3), np.uint8).transpose(2, 0, 1).astype(np.float32, order="K")
           for _ in range(4)]
    assert not chw[0].flags.c_contiguous
    ring.send(sender, chw)
    assert len(receiver.recv_bytes()) < 2048  # 3 MB of samples: only their description is on the pipe


def test_samples_kept_by_the_consumer_outlive_later_messages(channel):
    """The lifetime rule: a kept sample holds its slot; a dropped one hands it back."""
    ring, receiver, sender = channel
    kept = []
    for i in range(6):  # nothing is dropped: every message needs a slot of its own
        ring.send(sender, [np.full((i + 1, 4096), i, dtype=np.int32), i])
        array, label = ring.recv(receiver)
        array += 1  # writable, and the caller's to change
        kept.append((array[1:] if i else array, label))
    for i, (array, label) in enumerate(kept):
        assert label == i and array.shape == ((i or 1), 4096) and (array == i + 1).all()
    size = os.fstat(ring.fd).st_size
    kept.clear()  # every slot comes back ...
    for i in range(20):  # ... and is reused: the memory does not grow
        ring.send(sender, [np.full((3, 4096), i, dtype=np.int32)])
        assert (ring.recv(receiver)[0] == i).all()
    assert os.fstat(ring.fd).st_size == size


def _sender(target):
    """A forked process running ``target(conn, ring)``; returns (process, receiving end, ring)."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    ring = wire.Ring()
    proc = ctx.Process(target=target, args=(sender, ring))
    proc.start()
    sender.close()
    return proc, receiver, ring


def _send_half_and_die(conn, ring):
    # The frame's length promises 8 MB; the process exits after sending part of it.
    os.write(conn.fileno(), struct.pack("!i", 8_000_000) + b"x" * 1000)
    os._exit(0)


def test_wire_reports_a_sender_that_died_mid_message():
    proc, receiver, ring = _sender(_send_half_and_die)
    with pytest.raises((EOFError, OSError), match="end of file"):
        ring.recv(receiver)
    proc.join(10)
    receiver.close()
    ring.close()


def _send_tensors_and_exit(conn, ring):
    import torch

    ring.send(conn, [torch.arange(600.0).reshape(20, 30).t(), torch.ones(4096, dtype=torch.uint8),
                     torch.ones(3)])
    os._exit(0)


def test_wire_carries_torch_tensors_by_value_past_the_senders_exit():
    import torch

    proc, receiver, ring = _sender(_send_tensors_and_exit)
    proc.join(30)  # gone before the message is read: nothing may depend on it
    got = ring.recv(receiver)
    receiver.close()
    ring.close()
    assert torch.equal(got[0], torch.arange(600.0).reshape(20, 30).t())
    assert torch.equal(got[1], torch.ones(4096, dtype=torch.uint8))
    assert torch.equal(got[2], torch.ones(3))


def _image_file(tmp_path, name, fmt, mode="RGB"):
    from PIL import Image

    shape = (48, 40, 3) if mode == "RGB" else (48, 40)
    pixels = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    path = tmp_path / name
    Image.fromarray(pixels).save(path, format=fmt)
    return str(path)


@pytest.mark.parametrize("fmt,mode", [("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"), ("PNG", "L")])
def test_image_loader_equals_pil_in_both_layouts(tmp_path, fmt, mode):
    from PIL import Image

    path = _image_file(tmp_path, f"x.{fmt.lower()}", fmt, mode)
    with Image.open(path) as img:
        theirs = np.asarray(img.convert("RGB"))
    hwc = load_image(path, {"layout": "hwc"})
    assert hwc.dtype == np.uint8 and hwc.shape == (48, 40, 3) and np.array_equal(hwc, theirs)
    chw = load_image(path, {"layout": "chw"})
    assert chw.dtype == np.float32 and chw.shape == (3, 48, 40) and chw.flags.c_contiguous
    assert np.array_equal(chw, theirs.transpose(2, 0, 1).astype(np.float32))


def test_image_loader_uses_libjpeg_turbo_where_installed_and_pil_otherwise(tmp_path, monkeypatch):
    from stager.formats import images

    path = _image_file(tmp_path, "x.jpg", "JPEG")
    assert images.simplejpeg is not None, "simplejpeg is a dependency (setup.cfg)"
    fast = load_image(path, {"layout": "hwc"})
    monkeypatch.setattr(images, "simplejpeg", None)
    assert np.array_equal(load_image(path, {"layout": "hwc"}), fast)


def test_image_loader_names_a_file_that_is_no_image(tmp_path):
    path = tmp_path / "broken.jpg"
    path.write_bytes(b"\xff\xd8\xff" + b"not really a jpeg")
    with pytest.raises(ValueError, match=r"broken\.jpg: not a readable image"):
        load_image(str(path), {"layout": "hwc"})


def test_synthetic_jpegs_are_about_the_asked_size(tmp_path):
    manifest = make_dataset(str(tmp_path / "d"), 6, 60_000, classes=2, seed=4, progress=False, fmt="jpeg")
    with open(manifest, encoding="utf-8") as fh:
        rels = [line.split("\t")[0] for line in fh]
    assert all(rel.endswith(".jpg") for rel in rels)
    sizes = [os.path.getsize(tmp_path / "d" / rel) for rel in rels]
    assert all(50_000 < size < 70_000 for size in sizes), sizes
    assert load_image(str(tmp_path / "d" / rels[0]), {"layout": "chw"}).shape == (3, 256, 256)
