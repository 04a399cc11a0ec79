"""Where a group's service listens and keeps its files, and who may talk to it.

The service listens on a Unix socket in Linux's abstract namespace, named by
the user's id and the group (``LAUNCHER`` spells the name too): binding it is atomic, so of two jobs starting a
group at once one service wins, and the name vanishes with the process, so a
killed service leaves no stale socket. Anyone on the host could knock on an
abstract name; the kernel's credentials of each connection (``SO_PEERCRED``)
decide: the service serves its own user only, and a job talks only to a
service of its own user.
"""

import os
import socket
import struct

_PREFIX = "stager-share"

# Binds the group's address first (the claim), then forks the service; imports stager in the service only.
LAUNCHER = """
import errno, os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.bind("\\0stager-share-%d-%s" % (os.getuid(), sys.argv[1]))
except OSError as exc:
    print("taken" if exc.errno == errno.EADDRINUSE else "error: cannot listen: %s" % exc)
    sys.exit(0 if exc.errno == errno.EADDRINUSE else 1)
sock.listen(128)
setup = sys.stdin.buffer.read()
read, write = os.pipe()
if os.fork():
    os.close(write)
    said = os.fdopen(read, "rb").read().decode() or "error: the service process ended before it started"
    print(said)
    sys.exit(0 if said == "ready" else 1)
os.close(read)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)  # nobody's pipe is held open by the service
code = 1
try:
    from stager.engine.group.daemon import serve
    code = serve(sock, setup, write)
finally:
    os._exit(code)
"""


def address(name):
    """The group's socket address (abstract namespace) for this user."""
    return f"\0{_PREFIX}-{os.getuid()}-{name}"


def founding_address(name):
    """Held (bound) by the job that probes for the group and starts its service: one at a time."""
    return f"\0{_PREFIX}-found-{os.getuid()}-{name}"


def dir_prefix(name):
    """What every directory of this user's group ``name`` is named from (``<prefix>-<service pid>``)."""
    return f"{_PREFIX}-{os.getuid()}-{name}-"


def socket_uid(sock):
    """The user id of the process at the other end of a connected Unix socket (the kernel's record)."""
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def peer_uid(conn):
    """``socket_uid`` of a ``multiprocessing`` connection over a Unix socket."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return socket_uid(sock)
