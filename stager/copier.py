"""Copying one file from the shared file system to node-local storage.

A file appears under its final name only once it is complete: it is written
under a hidden temporary name in the same directory, its size is checked
against the catalog, and only then is it renamed (atomic within a file system).
A reader can therefore never see a partial file, even after a crash.
"""

import errno
import os
import threading


class SizeMismatch(OSError):
    """The copied byte count differs from the catalog's size."""


def _sendfile_all(src_fd, dst_fd):
    total = 0
    try:
        while True:
            sent = os.sendfile(dst_fd, src_fd, total, 1 << 24)
            if sent == 0:
                return total
            total += sent
    except OSError as exc:
        # Some file systems do not implement the splice path that sendfile
        # needs; fall back to plain reads and writes from where it stopped.
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP) or total:
            raise
    while True:
        chunk = os.read(src_fd, 1 << 20)
        if not chunk:
            return total
        view = memoryview(chunk)
        while view:
            written = os.write(dst_fd, view)
            view = view[written:]
        total += len(chunk)


def staged_size(dst_root, rel):
    """Size of an already published staged copy, or -1 when there is none."""
    try:
        return os.stat(os.path.join(dst_root, rel)).st_size
    except FileNotFoundError:
        return -1


def stage_file(src_root, dst_root, rel, expected_size):
    """Copies ``src_root/rel`` to ``dst_root/rel`` atomically.

    Args:
        src_root: Root of the shared (source) file system tree.
        dst_root: Root of the node-local staging directory.
        rel: Relative path of the sample.
        expected_size: Size recorded in the catalog.

    Returns:
        Bytes copied; 0 when a complete copy was already there.

    Raises:
        SizeMismatch: If the source's size differs from the catalog's.
        OSError: From the file systems (missing source, ENOSPC, ...); the
            temporary file is removed first.
    """
    if staged_size(dst_root, rel) == expected_size:
        return 0
    dst = os.path.join(dst_root, rel)
    directory, name = os.path.split(dst)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.part")
    src_fd = os.open(os.path.join(src_root, rel), os.O_RDONLY)
    try:
        dst_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            copied = _sendfile_all(src_fd, dst_fd)
        finally:
            os.close(dst_fd)
        if copied != expected_size:
            raise SizeMismatch(errno.EIO, f"copied {copied} bytes, catalog says {expected_size}: "
                                          "the source changed since the catalog was made")
        os.rename(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    finally:
        os.close(src_fd)
    return copied
