"""Which program serves the slow file system emulator, and building the C one.

Two engines behave the same and take the same arguments: ``slowfsd.c``
(libfuse3, compiled here on first use) and the Python one in ``pyengine.py``
(mfusepy). The C engine is preferred because the emulator must deliver the
latency and bandwidth it is given rather than its own CPU cost: in Python
each file costs about 0.6 ms of CPU, which capped a 2-core machine near
1,000 files/s whatever the latency (docs/benchmarks.md).

The binary is named after a hash of its source, so an upgraded source is
rebuilt, and is published by rename, so concurrent builders (ranks, test
workers) never run a half-written file.
"""

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys

ENGINES = ("auto", "c", "python")

log = logging.getLogger(__name__)

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowfsd.c")
_HINT = ("install a C compiler and the libfuse3 headers (Debian: apt-get install gcc libc6-dev "
         "libfuse3-dev pkg-config), or choose the Python engine (--engine python, slowfs.engine: python)")


class EngineUnavailable(RuntimeError):
    """The C engine cannot be built here; the message says what is missing."""


def _build_dir():
    # Inside the environment stager is installed in when it is writable (a
    # venv), else the user's cache: never a temporary directory, so it is
    # built once.
    if os.access(sys.prefix, os.W_OK):
        return os.path.join(sys.prefix, "libexec", "stager")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "stager")


def _fuse_flags():
    if shutil.which("pkg-config"):
        res = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
        if res.returncode == 0:
            return res.stdout.split()
    if os.path.exists("/usr/include/fuse3/fuse.h"):
        return ["-I/usr/include/fuse3", "-lfuse3", "-lpthread"]
    raise EngineUnavailable(f"slowfs: the libfuse3 headers are missing (no fuse3 in pkg-config, no "
                            f"/usr/include/fuse3/fuse.h); {_HINT}")


def c_engine_path():
    """Where the C engine for this source lives once built."""
    with open(_SOURCE, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()[:12]
    return os.path.join(_build_dir(), f"slowfsd-{digest}")


def build_c_engine():
    """Returns the C engine's path, compiling it first if needed.

    Raises:
        EngineUnavailable: No compiler, no libfuse3 headers, or the
            compiler's error (included).
    """
    path = c_engine_path()
    if os.access(path, os.X_OK):
        return path
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise EngineUnavailable(f"slowfs: no C compiler (cc, gcc or $CC) to build {_SOURCE}; {_HINT}")
    flags = _fuse_flags()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        res = subprocess.run([compiler, "-O2", "-Wall", "-o", tmp, _SOURCE] + flags + ["-lpthread"],
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise EngineUnavailable(f"slowfs: building the C engine failed ({compiler} {_SOURCE}):\n"
                                    f"{res.stderr.strip()}\n{_HINT}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@functools.lru_cache(maxsize=None)
def _auto_choice():
    # Decided once per process, so the fallback is announced once.
    try:
        return build_c_engine()
    except EngineUnavailable as exc:
        log.warning("%s\nslowfs: using the Python engine, which is slower (about 1,000 files/s on 2 cores)",
                    exc)
        return None


def engine_command(engine):
    """The command that serves a mount, without its arguments.

    Args:
        engine: ``auto`` (C if it can be built, else Python, with a warning),
            ``c`` or ``python``.

    Raises:
        ValueError: For an unknown engine.
        EngineUnavailable: For ``c`` when it cannot be built.
    """
    if engine not in ENGINES:
        raise ValueError(f"slowfs: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    path = build_c_engine() if engine == "c" else _auto_choice() if engine == "auto" else None
    return [path] if path else [sys.executable, "-m", "stager.slowfs.pyengine"]
