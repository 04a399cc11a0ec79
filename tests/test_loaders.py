"""The built-in decoders, and the wire that carries decoded minibatches."""

import multiprocessing
import os
import threading

import numpy as np
import pytest

from stager import wire
from stager.loaders import load_npy

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


def test_wire_carries_arrays_and_objects_intact():
    receiver, sender = multiprocessing.Pipe(duplex=False)
    wire.widen(sender)
    big = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)  # larger than the pipe
    message = ("batch", 7, [big, np.asfortranarray(ARRAYS["fortran"]), ARRAYS["image"][:, ::2], (b"raw", 3)])
    thread = threading.Thread(target=wire.send, args=(sender, message))
    thread.start()
    got = wire.recv(receiver)
    thread.join()
    assert got[:2] == ("batch", 7)
    for ours, theirs in zip(got[2][:3], message[2][:3]):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs) and ours.flags.writeable
    assert got[2][1].flags.f_contiguous
    assert got[2][3] == (b"raw", 3)
    receiver.close()
    sender.close()


def _sender(target):
    """A forked process running ``target(conn)``; returns (process, receiving end)."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(sender,))
    proc.start()
    sender.close()
    return proc, receiver


def _send_half_and_die(conn):
    # The header promises 8 MB; the process exits after sending part of it.
    conn.send_bytes(__import__("pickle").dumps((b"", [8_000_000])))
    os.write(conn.fileno(), b"x" * 1000)
    os._exit(0)


def test_wire_reports_a_sender_that_died_mid_message():
    proc, receiver = _sender(_send_half_and_die)
    with pytest.raises(EOFError, match="short of a message"):
        wire.recv(receiver)
    proc.join(10)
    receiver.close()


def _send_tensors_and_exit(conn):
    import torch

    wire.send(conn, [torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.uint8)])
    os._exit(0)


def test_wire_carries_torch_tensors_by_value_past_the_senders_exit():
    import torch

    proc, receiver = _sender(_send_tensors_and_exit)
    proc.join(30)  # gone before the message is read: nothing may depend on it
    got = wire.recv(receiver)
    receiver.close()
    assert torch.equal(got[0], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(got[1], torch.ones(4, dtype=torch.uint8))
