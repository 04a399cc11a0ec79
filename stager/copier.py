"""Copying one file from the shared file system to node-local storage.

A file appears under its final name only once it is complete: it is written
under a hidden temporary name in the same directory, its size is checked
against the catalog, and only then is it renamed (atomic within a file system).
A reader can therefore never see a partial file, even after a crash.
"""

import errno
import os
import threading


class SourceChanged(OSError):
    """The source file's size or modification time differs from the catalog's."""


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


def already_staged(dst_root, rel, size, mtime_ns):
    """Whether a published copy matches the catalog's size and modification time."""
    try:
        st = os.stat(os.path.join(dst_root, rel))
    except FileNotFoundError:
        return False
    return st.st_size == size and (mtime_ns is None or st.st_mtime_ns == mtime_ns)


def stage_file(src_root, dst_root, rel, expected_size, mtime_ns=None):
    """Copies ``src_root/rel`` to ``dst_root/rel`` atomically.

    The copy keeps the source's modification time, so a copy left by an
    earlier run (``staging.keep``) is reused only if the source is unchanged.

    Args:
        src_root: Root of the shared (source) file system tree.
        dst_root: Root of the node-local staging directory.
        rel: Relative path of the sample.
        expected_size: Size recorded in the catalog.
        mtime_ns: Modification time recorded in the catalog, or None.

    Returns:
        Bytes copied; 0 when a matching copy was already there.

    Raises:
        SourceChanged: If the source's size or modification time differs
            from the catalog's, or it changed during the copy.
        OSError: From the file systems (missing source, ENOSPC, ...); the
            temporary file is removed first.
    """
    if already_staged(dst_root, rel, expected_size, mtime_ns):
        return 0
    dst = os.path.join(dst_root, rel)
    directory, name = os.path.split(dst)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.part")
    src_fd = os.open(os.path.join(src_root, rel), os.O_RDONLY)
    try:
        st = os.fstat(src_fd)
        if st.st_size != expected_size or (mtime_ns is not None and st.st_mtime_ns != mtime_ns):
            raise SourceChanged(errno.EIO, f"the source changed since the catalog was made: size {st.st_size} "
                                           f"(catalog says {expected_size}), mtime_ns {st.st_mtime_ns} "
                                           f"(catalog says {mtime_ns})")
        dst_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            copied = _sendfile_all(src_fd, dst_fd)
        finally:
            os.close(dst_fd)
        if copied != expected_size:
            raise SourceChanged(errno.EIO, f"copied {copied} bytes, catalog says {expected_size}: "
                                           "the source changed during the copy")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
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
