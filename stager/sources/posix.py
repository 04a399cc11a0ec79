"""The POSIX source: a directory tree on a shared file system (Lustre, GPFS, NFS).

It is only ever read: listed once (a manifest or one scan, on rank 0),
fetched file by file into node-local storage by the prefetchers, or read in
place by the readers when staging is off.
"""

import errno
import os
import stat
import time

from ..errors import CatalogError
from .listing import Listing, directory_labels, first_duplicate, is_manifest_file, manifest_entries
from .deadline import reading
from .publish import SourceChanged, TornCopy, already_published, publish
from .verify import check_mode, hash_file, identity

# Copies of one file made before giving up on a source that keeps changing
# under them: a writer that finished lets the second attempt through.
COPY_ATTEMPTS = 3


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


class PosixSource:
    """A dataset root directory, read through the operating system.

    Picklable (a root path), so prefetchers started by any method get it.

    Args:
        root: The dataset root.
        verify: How a copy is checked before it is published
            (``staging.verify``: ``none``, ``size``, ``xxhash``; ``verify.py``).
        concurrency: Files a prefetcher copies at once, in threads
            (``dataset.requests_in_flight``): a shared file system's open
            latency is waited for in parallel.
    """

    scheme = "file"

    def __init__(self, root, verify="size", concurrency=1):
        check_mode(verify)
        self.root = os.path.abspath(root)
        self.verify = verify
        self.concurrency = concurrency

    @property
    def local_root(self):
        """Where readers can open items in place (staging off): the root itself."""
        return self.root

    def describe(self, rel):
        """The item's full name, for messages."""
        return os.path.join(self.root, rel)

    def fetch(self, rel, size, mtime_ns, dst_root, times=None):
        """Copies ``root/rel`` to ``dst_root/rel``, checked and atomic (``publish``).

        The copy keeps the source's modification time, so a copy left by an
        earlier run (``staging.keep``) is reused only if the source is unchanged.
        A copy that the source changed under (``verify``) is discarded and
        made again, up to ``COPY_ATTEMPTS`` times in all. ``times``: a list
        that gets each attempt's ``(asked, opened, began, ended)`` instants
        (``time.perf_counter``): the probe times the open and the bytes of
        the copy it keeps, without opening the file twice.

        Returns:
            Bytes copied (0 for an empty file); None when a matching copy was already there.

        Raises:
            SourceChanged: If the source's size or modification time differs
                from the catalog's, or it changed during every attempt.
            OSError: From the file systems (missing source, ENOSPC, ...).
        """
        if already_published(dst_root, rel, size, mtime_ns):
            return None
        path = os.path.join(self.root, rel)
        torn = []
        for _ in range(COPY_ATTEMPTS):
            try:
                return self._copy(path, rel, size, mtime_ns, dst_root, times)
            except TornCopy as exc:
                torn.append(exc.strerror)
            except SourceChanged as exc:
                if not torn:
                    raise SourceChanged(errno.EIO, f"{path}: {exc.strerror}") from None
                raise SourceChanged(errno.EIO, f"{path} changed during the copy ({torn[0]}), so the copy was not "
                                               f"published, and now {exc.strerror}") from None
        raise SourceChanged(errno.EIO, f"{path} changed during each of {COPY_ATTEMPTS} copies, so no copy was "
                                       f"published ({'; '.join(torn)}); is something rewriting the dataset?")

    def _copy(self, path, rel, size, mtime_ns, dst_root, times=None):
        asked = time.perf_counter()
        src_fd = os.open(path, os.O_RDONLY)
        opened = time.perf_counter()

        def copy(dst_fd):
            began = time.perf_counter()
            copied = _sendfile_all(src_fd, dst_fd)
            if times is not None:
                times.append((asked, opened, began, time.perf_counter()))
            return copied

        try:
            before = identity(src_fd)
            if before.size != size or (mtime_ns is not None and before.mtime_ns != mtime_ns):
                raise SourceChanged(errno.EIO, f"the source changed since the catalog was made: size "
                                               f"{before.size} (catalog says {size}), mtime_ns "
                                               f"{before.mtime_ns} (catalog says {mtime_ns})")

            def check(tmp):
                after = identity(src_fd)
                if after != before:
                    raise TornCopy(errno.EIO, before.differences(after))
                if self.verify == "xxhash":
                    copied, again = hash_file(tmp), hash_file(path)
                    if copied != again:
                        raise TornCopy(errno.EIO, f"xxh3 of the copy {copied} differs from a second read's {again}")

            return publish(dst_root, rel, size, copy,
                           (before.mtime_ns, before.mtime_ns),
                           None if self.verify == "none" else check)
        finally:
            os.close(src_fd)

    def read_manifest(self, manifest):
        """Reads a manifest: one relative path per line, optional label after a tab.

        Blank lines and lines starting with ``#`` are skipped (``manifest_entries``).
        Every listed file is checked to exist inside the root, and its size is recorded.

        Args:
            manifest: Manifest file; relative paths are taken from the root.

        Returns:
            A ``Listing``.

        Raises:
            CatalogError: Naming the manifest line at fault.
        """
        root = self.root
        manifest = manifest if os.path.isabs(manifest) else os.path.join(root, manifest)
        with reading("stat", root):
            real_root = os.path.realpath(root)
        try:
            with reading("open", manifest), open(manifest, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise CatalogError(f"cannot read manifest {manifest}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise CatalogError(f"manifest {manifest} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
        paths, sizes, labels, mtimes, reals, wheres = [], [], [], [], [], []
        for where, rel, label in manifest_entries(lines, manifest):
            full = os.path.join(real_root, rel)
            with reading("stat", full):
                real = os.path.realpath(full)
            reals.append(real)
            wheres.append(where)
            if os.path.commonpath([real, real_root]) != real_root:
                raise CatalogError(f"{where}: {rel!r} resolves to {real}, outside the dataset root {real_root}")
            try:
                with reading("stat", real):
                    st = os.stat(real)
            except OSError as exc:
                raise CatalogError(f"{where}: sample {rel!r} not readable: {exc.strerror}") from None
            if not stat.S_ISREG(st.st_mode):
                raise CatalogError(f"{where}: sample {rel!r} is not a regular file")
            paths.append(rel)
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
            labels.append(label)
        twice = first_duplicate(reals)
        if twice is not None:  # two names, through a symbolic link, of one file
            i, j = twice
            raise CatalogError(f"{wheres[j]}: {paths[j]!r} is the file {reals[j]}, already listed as {paths[i]!r} "
                               f"at {wheres[i]}; list each sample once")
        return Listing(paths, sizes, None if labels[0] is None else labels, mtimes)

    def scan(self, extensions=()):
        """Scans a directory tree once.

        Hidden files and directories are skipped, and so is a manifest at
        the root (``manifest.*``, ``listing.is_manifest_file``). When every sample lies in a
        first-level subdirectory (the ImageNet layout), those directories are
        the classes: labels are their indices in sorted order.

        Args:
            extensions: Keep only files ending in one of these; empty keeps all.

        Returns:
            A ``Listing``.

        Raises:
            CatalogError: If the root is missing or holds no samples, or a
                symbolic link points outside it.
        """
        root = self.root
        with reading("stat", root):
            if not os.path.isdir(root):
                raise CatalogError(f"dataset root {root} is not a directory")
        found = list(self.walk(extensions))
        if not found:
            raise CatalogError(f"dataset at {root} has no samples"
                               + (f" with extensions {list(extensions)}" if extensions else ""))
        paths, sizes, mtimes = (list(column) for column in zip(*found))
        return Listing(paths, sizes, directory_labels(paths), mtimes)

    def subtrees(self):
        """The root's first-level subdirectories, sorted, hidden ones left out: the parts of a parallel scan."""
        with reading("listing", self.root), os.scandir(os.path.realpath(self.root)) as entries:
            # A linked directory is not followed by the scan either.
            return sorted(e.name for e in entries
                          if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))

    def walk(self, extensions=(), top="", recurse=True):
        """Yields ``(relpath, size, mtime_ns)`` of the files under ``top``, in scan order.

        Args:
            extensions: Keep only files ending in one of these; empty keeps all.
            top: A subdirectory of the root ("" for the root itself).
            recurse: False lists ``top``'s own files only.

        Raises:
            CatalogError: If a symbolic link points outside the root.
        """
        with reading("stat", self.root):
            real_root = os.path.realpath(self.root)
        start = os.path.join(real_root, top)
        tree = os.walk(start)
        while True:
            with reading("listing", start):  # the next directory of the walk under ``start``
                step = next(tree, None)
            if step is None:
                return
            dirpath, dirnames, filenames = step
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if recurse else []
            for name in sorted(filenames):
                if name.startswith(".") or (extensions and not name.endswith(tuple(extensions))):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, real_root).replace(os.sep, "/")
                if is_manifest_file(rel):
                    continue
                with reading("stat", full):
                    real = os.path.realpath(full)
                    if os.path.commonpath([real, real_root]) != real_root:
                        raise CatalogError(f"{full}: symbolic link to {real}, outside the dataset root {real_root}")
                    try:
                        st = os.stat(real)
                    except OSError:
                        continue  # a dangling link, or no permission: not a sample, as before
                if not stat.S_ISREG(st.st_mode):
                    continue
                yield rel, st.st_size, st.st_mtime_ns
