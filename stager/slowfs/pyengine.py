"""The emulator's Python engine (mfusepy): a read-only passthrough that
sleeps on every open and books every read on one shared bandwidth timeline.

The C engine (``slowfsd.c``) is preferred; this one runs where no compiler or
libfuse3 headers exist. Entry point: ``python -m stager.slowfs.pyengine``.
"""

import argparse
import errno
import os
import subprocess
import threading
import time

from .mount import FSNAME, fusermount


_INTERRUPT_POLL_S = 0.02  # the longest single sleep: an interrupted request is noticed within this


def _sleep(seconds, interrupted):
    """Sleeps ``seconds``; raises EINTR once ``interrupted()`` says the caller's request was interrupted."""
    deadline = time.monotonic() + seconds
    while True:
        if interrupted():
            import mfusepy

            raise mfusepy.FuseOSError(errno.EINTR)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, _INTERRUPT_POLL_S))


class _Throttle:
    """A shared bandwidth cap: each read waits for its slot on one timeline."""

    def __init__(self, bytes_per_s):
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.free_at = time.monotonic()

    def take(self, nbytes, interrupted):
        """Waits until ``nbytes`` would have arrived; EINTR if the caller is interrupted meanwhile."""
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.free_at)
            self.free_at = start + nbytes / self.rate
            done = self.free_at
        delay = done - time.monotonic()
        if delay > 0:
            _sleep(delay, interrupted)


class _Settings:
    """The latency and bandwidth in force; the owner may change them while mounted."""

    def __init__(self, open_s, bytes_per_s):
        self.open_s = open_s
        self.throttle = _Throttle(bytes_per_s)

    def apply(self, line):
        """Applies one ``open-ms F`` or ``mbps F`` line from the owner's pipe."""
        try:
            name, value = line.split()
            value = float(value)
        except ValueError:
            return
        if value < 0:
            return
        if name == "open-ms":
            self.open_s = value / 1000.0
        elif name == "mbps":
            self.throttle.rate = value * 1e6


def _operations(root, settings, ready_fd, ignore_interrupts=False):
    # mfusepy is imported here so that importing stager never needs libfuse.
    import mfusepy

    # libfuse flags the request a thread serves when the kernel forwards its
    # caller's signal (FUSE_INTERRUPT); a hung server (ignore_interrupts)
    # never looks.
    interrupted = (lambda: False) if ignore_interrupts else (lambda: bool(mfusepy._libfuse.fuse_interrupted()))

    class SlowPassthrough(mfusepy.Operations):
        use_ns = True

        def __init__(self):
            self.root = os.path.realpath(root)

        def _full(self, path):
            return os.path.join(self.root, path.lstrip("/"))

        def init(self, path):
            if ready_fd is not None:
                os.write(ready_fd, b"ready\n")
                os.close(ready_fd)

        def getattr(self, path, fh=None):
            st = os.lstat(self._full(path)) if fh is None else os.fstat(fh)
            keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns",
                    "st_ctime_ns")
            out = {k.replace("_ns", ""): getattr(st, k) for k in keys}
            out["st_mode"] &= ~0o222  # read only
            return out

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._full(path))

        def readlink(self, path):
            return os.readlink(self._full(path))

        def statfs(self, path):
            sv = os.statvfs(self._full(path))
            return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                 "f_files", "f_ffree", "f_namemax")}

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            open_s = settings.open_s
            if open_s > 0:
                _sleep(open_s, interrupted)
            return os.open(self._full(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            data = os.pread(fh, size, offset)
            settings.throttle.take(len(data), interrupted)
            return data

        def release(self, path, fh):
            os.close(fh)
            return 0

    return SlowPassthrough()


def _unmount_when_owner_dies(owner_fd, mountpoint, owner_gone, settings):
    # Blocks until the owner closes its end of the pipe, which the kernel does
    # when the owner dies, however it dies. A clean owner unmounts first, so
    # the daemon is usually gone before this returns. Lines the owner writes
    # meanwhile change the settings.
    pending = b""
    while True:
        chunk = os.read(owner_fd, 1024)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            settings.apply(line.decode(errors="replace"))
    owner_gone.set()
    subprocess.run([fusermount(), "-u", "-z", mountpoint], capture_output=True)


def serve(source, mountpoint, open_ms, mbps, ready_fd=None, owner_fd=None, remove_mountpoint=False,
          ignore_interrupts=False):
    """Runs the file system in the foreground until it is unmounted.

    Args:
        source: Directory to expose.
        mountpoint: Where to mount.
        open_ms: Latency per open, in milliseconds.
        mbps: Shared bandwidth cap in MB/s; 0 = unlimited.
        ready_fd: File descriptor to write ``ready`` to once mounted.
        owner_fd: Read end of a pipe held by the owner; when it reaches EOF
            (the owner died) the file system unmounts itself.
        remove_mountpoint: With ``owner_fd``, also remove the mount point then.
        ignore_interrupts: Never cut a sleep short when its caller is
            interrupted (a hung server): a reader killed meanwhile stays in
            the kernel until the sleep ends or the daemon dies.
    """
    import mfusepy

    owner_gone = threading.Event()
    settings = _Settings(open_ms / 1000.0, mbps * 1e6)
    if owner_fd is not None:
        threading.Thread(target=_unmount_when_owner_dies, args=(owner_fd, mountpoint, owner_gone, settings),
                         daemon=True).start()

    ops = _operations(source, settings, ready_fd, ignore_interrupts)
    # libfuse serves at most 10 requests at once by default: fewer than the
    # opens a parallel file system takes at once, and than 16 prefetchers.
    # Attributes are not kept (the C engine keeps them and drops those of a
    # file that changes beneath it): an fstat always sees the file as it is.
    mfusepy.FUSE(ops, mountpoint, foreground=True, nothreads=False, ro=True, max_threads=128, attr_timeout=0,
                 fsname=f"{FSNAME}:{os.getpid()}", default_permissions=True)
    if owner_gone.is_set() and remove_mountpoint:
        try:
            os.rmdir(mountpoint)  # the owner made it and can no longer remove it
        except OSError:
            pass


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m stager.slowfs.pyengine", description="Serve a slow FUSE passthrough.")
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--mbps", type=float, default=0.0)
    parser.add_argument("--ready-fd", type=int, default=None)
    parser.add_argument("--owner-fd", type=int, default=None)
    parser.add_argument("--remove-mountpoint", action="store_true")
    parser.add_argument("--ignore-interrupts", action="store_true")
    args = parser.parse_args(argv)
    serve(args.source, args.mountpoint, args.open_ms, args.mbps, args.ready_fd, args.owner_fd,
          args.remove_mountpoint, args.ignore_interrupts)


if __name__ == "__main__":
    main()
