"""Mounting and unmounting the emulated slow shared file system.

Metadata-heavy parallel file systems (Lustre under load) are slow mostly per
open, and their bandwidth is shared; the emulator reproduces both on one
machine so that the demo, the tests and the benchmarks have a realistic
source. ``SlowFS`` is a context manager that mounts in a child process and
unmounts on exit; ``mount`` / ``umount`` back the ``stager slowfs`` commands,
where the daemon outlives the command and ``umount`` ends it. The daemon's pid
is kept in the mount's source name (``stager-slowfs:<pid>``), so ``umount``
finds it in ``/proc/self/mounts`` without a pid file.
"""

import os
import select
import shutil
import signal
import subprocess
import tempfile

from .engine import engine_command

FSNAME = "stager-slowfs"


def mount_entry(mountpoint):
    """The source name of the emulator mount at ``mountpoint`` (``stager-slowfs:<pid>``), or None."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 2 and fields[1].replace("\\040", " ") == target and fields[0].startswith(FSNAME):
                return fields[0]
    return None


def fusermount():
    """Path of fusermount3 (or fusermount)."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise RuntimeError("fusermount3 not found: install the fuse3 package (apt-get install fuse3)")
    return tool


def mount(source, mountpoint, open_ms=10.0, mbps=0.0, timeout_s=30.0, log_path=None, owner_fd=None,
          remove_mountpoint=False, engine="auto", ignore_interrupts=False):
    """Starts the emulator as a background process and waits until it is mounted.

    Args:
        source: Directory to expose read-only.
        mountpoint: Empty directory to mount on.
        open_ms: Latency per open, in milliseconds.
        mbps: Shared bandwidth cap in MB/s; 0 = unlimited.
        timeout_s: How long to wait for the mount.
        log_path: File for the daemon's output; default: discarded.
        owner_fd: Read end of a pipe whose write end the caller keeps open
            while it owns the mount; the mount ends itself at EOF. None: the
            mount lasts until ``umount`` (the ``stager slowfs`` command).
        remove_mountpoint: With ``owner_fd``, remove the mount point too.
        engine: ``auto``, ``c`` or ``python`` (see ``engine``).
        ignore_interrupts: Emulate a hung server: a sleeping open or read
            never ends early when its caller is interrupted, so a reader
            killed meanwhile stays in the kernel (state D) until the daemon
            answers or dies (``umount(..., mode="force")``).

    Returns:
        The daemon's ``subprocess.Popen``.

    Raises:
        RuntimeError: If FUSE is unavailable, the engine cannot be built or
            the mount fails; the daemon's error output is included.
    """
    if not os.path.isdir(source):
        raise RuntimeError(f"slowfs: source {source} is not a directory")
    if not os.path.isdir(mountpoint):
        raise RuntimeError(f"slowfs: mount point {mountpoint} is not a directory")
    fusermount()
    if not os.path.exists("/dev/fuse"):
        raise RuntimeError("slowfs: /dev/fuse is missing; FUSE is not available on this machine")
    daemon = engine_command(engine)
    read_fd, write_fd = os.pipe()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    cmd = daemon + [os.path.abspath(source), os.path.abspath(mountpoint), "--open-ms", str(open_ms),
                    "--mbps", str(mbps), "--ready-fd", str(write_fd)]
    if ignore_interrupts:
        cmd.append("--ignore-interrupts")
    fds = (write_fd,)
    if owner_fd is not None:
        cmd += ["--owner-fd", str(owner_fd)] + (["--remove-mountpoint"] if remove_mountpoint else [])
        fds += (owner_fd,)
    proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.PIPE if log is subprocess.DEVNULL else log, start_new_session=True)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        answer = os.read(read_fd, 64) if ready else b""
    finally:
        os.close(read_fd)
        if log is not subprocess.DEVNULL:
            log.close()
    if answer.startswith(b"ready"):
        if proc.stderr is not None:
            proc.stderr.close()  # keep no pipe the daemon could block on
            proc.stderr = None
        return proc
    err = b""
    if proc.poll() is None:
        proc.kill()
        # It may have mounted without saying so; never leave a dead mount.
        subprocess.run([fusermount(), "-u", "-z", mountpoint], capture_output=True)
    if proc.stderr is not None:
        err = proc.stderr.read()
        proc.stderr.close()
    proc.wait()
    raise RuntimeError(f"slowfs: mounting {source} on {mountpoint} failed: "
                       f"{err.decode(errors='replace').strip() or 'timed out'}")


UMOUNT_MODES = ("normal", "lazy", "force")


def umount(mountpoint, timeout_s=30.0, mode="normal"):
    """Unmounts an emulator mount and waits for its daemon to exit.

    Args:
        mountpoint: The mount.
        timeout_s: How long to wait for the daemon.
        mode: ``normal`` fails while a file is open on the mount; ``lazy``
            detaches it at once (``fusermount3 -u -z``) and lets the daemon
            exit when the last reader closes, without waiting for that;
            ``force`` detaches it and ends the daemon (SIGTERM, then
            SIGKILL), which fails every request still pending with ENOTCONN,
            so that a reader blocked in the kernel on a hung mount returns.

    Raises:
        RuntimeError: If ``mountpoint`` is not a stager slowfs mount or
            ``fusermount3 -u`` fails.
    """
    if mode not in UMOUNT_MODES:
        raise ValueError(f"slowfs: unknown umount mode {mode!r}; choose one of {', '.join(UMOUNT_MODES)}")
    entry = mount_entry(mountpoint)
    if entry is None:
        raise RuntimeError(f"slowfs: {mountpoint} is not a stager slowfs mount")
    pid = int(entry.split(":", 1)[1]) if ":" in entry else None
    # The daemon's pidfd, taken before the unmount so that its pid cannot be reused meanwhile.
    pidfd = _pidfd(pid)
    try:
        lazy = ["-z"] if mode != "normal" else []
        result = subprocess.run([fusermount(), "-u", *lazy, mountpoint], capture_output=True, text=True)
        if result.returncode != 0:
            hint = " (a file is open on it: --lazy detaches it now, --force also ends a hung daemon)" \
                if mode == "normal" else ""
            raise RuntimeError(f"slowfs: fusermount3 -u {' '.join(lazy + [mountpoint])} failed: "
                               f"{result.stderr.strip()}{hint}")
        if pidfd is None or mode == "lazy":
            return
        if mode == "force" and not _exited(pidfd, 0):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            if not _exited(pidfd, min(2.0, timeout_s)):
                # A daemon thread asleep in a request can hold its exit up:
                # killing it aborts the connection, failing what is pending.
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _exited(pidfd, timeout_s)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid):
    if pid is None:
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _exited(pidfd, timeout_s):
    ready, _, _ = select.select([pidfd], [], [], timeout_s)  # readable once the process has exited
    return bool(ready)


class SlowFS:
    """Mounts ``source`` read-only through the emulator for a ``with`` block.

    The mount is tied to this process: should it die without unmounting,
    the daemon unmounts (and removes a temporary mount point) by itself.

    Args:
        source: Directory to expose.
        mountpoint: Where to mount; default: a new temporary directory,
            removed again on exit.
        open_ms: Latency per open, in milliseconds.
        mbps: Shared bandwidth cap in MB/s; 0 = unlimited.
        engine: ``auto``, ``c`` or ``python`` (see ``engine``).
        ignore_interrupts: Emulate a hung server (see ``mount``).
    """

    def __init__(self, source, mountpoint=None, open_ms=10.0, mbps=0.0, engine="auto", ignore_interrupts=False):
        self.source = source
        self.ignore_interrupts = ignore_interrupts
        self.engine = engine
        self.mountpoint = mountpoint
        self.open_ms = open_ms
        self.mbps = mbps
        self._proc = None
        self._made_dir = False

    def __enter__(self):
        if self.mountpoint is None:
            self.mountpoint = tempfile.mkdtemp(prefix="stager-slowfs-")
            self._made_dir = True
        owner_read, self._owner = os.pipe()
        try:
            self._proc = mount(self.source, self.mountpoint, self.open_ms, self.mbps, owner_fd=owner_read,
                               remove_mountpoint=self._made_dir, engine=self.engine,
                               ignore_interrupts=self.ignore_interrupts)
        except BaseException:
            os.close(self._owner)
            self._cleanup_dir()
            raise
        finally:
            os.close(owner_read)
        return self.mountpoint

    def __exit__(self, *exc_info):
        self.close()

    def set(self, open_ms=None, mbps=None):
        """Changes the latency per open and the bandwidth cap while mounted.

        The daemon reads the change from the owner's pipe and applies it to
        opens and reads that start after it has read it (within a
        millisecond or so; nothing is acknowledged).

        Args:
            open_ms: New latency per open in milliseconds; None keeps it.
            mbps: New shared bandwidth cap in MB/s (0: none); None keeps it.
        """
        if self._proc is None:
            raise RuntimeError("slowfs: set() needs a mounted SlowFS")
        lines = []
        for name, value in (("open-ms", open_ms), ("mbps", mbps)):
            if value is not None:
                if value < 0:
                    raise ValueError(f"slowfs: {name} must not be negative, got {value}")
                lines.append(f"{name} {float(value)!r}\n")
                setattr(self, name.replace("-", "_"), value)
        os.write(self._owner, "".join(lines).encode())

    def close(self):
        """Unmounts and ends the daemon; safe to call twice."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            umount(self.mountpoint)
        except RuntimeError:
            # Busy (a process still has a file open): detach lazily so the
            # daemon can exit, rather than leave the mount behind.
            subprocess.run([fusermount(), "-u", "-z", self.mountpoint], capture_output=True)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(self._owner)
        self._cleanup_dir()

    def _cleanup_dir(self):
        if self._made_dir:
            try:
                os.rmdir(self.mountpoint)
            except OSError:
                pass  # still busy; never hide the error that brought us here
            self._made_dir = False
