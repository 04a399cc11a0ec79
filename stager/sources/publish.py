"""Publishing a fetched file in node-local storage: whole and checked, or not at all.

Every source writes a file the same way: under a hidden temporary name in the
target directory, its size checked against the catalog, then renamed (atomic
within a file system). A reader can therefore never see a partial file, even
after a crash, and a failed fetch leaves nothing behind.
"""

import errno
import os
import threading


class SourceChanged(OSError):
    """The source item's size or modification time differs from the catalog's."""


class TornCopy(SourceChanged):
    """The source changed while it was copied: the copy is neither version (the fetch may try again)."""


def already_published(dst_root, rel, size, mtime_ns):
    """Whether a published copy matches the catalog's size and modification time."""
    try:
        st = os.stat(os.path.join(dst_root, rel))
    except FileNotFoundError:
        return False
    return st.st_size == size and (mtime_ns is None or st.st_mtime_ns == mtime_ns)


def _create(directory, tmp):
    """Opens ``tmp`` for writing, new; its directory is made only when the open finds it missing.

    Nothing in the staging tree removes a directory while a job runs, so
    after a class's first file the open alone succeeds: three system calls a
    file fewer than making sure of the directory each time.
    """
    try:
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def publish(dst_root, rel, expected_size, fill, times_ns=None, check=None):
    """Writes ``dst_root/rel`` through ``fill`` and publishes it atomically.

    Args:
        dst_root: Root of the node-local staging directory.
        rel: Relative path of the item.
        expected_size: Size recorded in the catalog.
        fill: Callable ``(fd) -> bytes_written`` that writes the content.
        times_ns: ``(atime_ns, mtime_ns)`` to give the copy (the source's, so
            a kept copy is reused only while the source is unchanged), or None.
        check: Callable ``(tmp_path)`` run on the whole copy before it is
            published, raising (``TornCopy``) to refuse it, or None.

    Returns:
        Bytes written.

    Raises:
        ValueError: For a path that would leave ``dst_root``.
        TornCopy: If ``fill`` wrote another number of bytes than expected, or from ``check``.
        OSError: From the file system (ENOSPC, ...); the temporary file is
            removed first.
    """
    if os.path.isabs(rel) or ".." in rel.split("/"):
        raise ValueError(f"{rel!r} would leave the staging directory; paths are relative to the dataset root")
    dst = os.path.join(dst_root, rel)
    directory, name = os.path.split(dst)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        fd = _create(directory, tmp)
        try:
            written = fill(fd)
        finally:
            os.close(fd)
        if written != expected_size:
            raise TornCopy(errno.EIO, f"copied {written} bytes, catalog says {expected_size}: "
                                           "the source changed during the copy")
        if check is not None:
            check(tmp)
        if times_ns is not None:
            os.utime(tmp, ns=times_ns)
        os.rename(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return written
