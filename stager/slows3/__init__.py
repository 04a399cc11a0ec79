"""An emulated remote object store (a tool: tests and benchmarks use it).

``ObjectStore`` runs an S3-compatible server (moto) on loopback in a child
process; ``SlowProxy`` puts a latency per request, a shared bandwidth cap and
injected error answers (503 SlowDown, 403, ...) in front of it, as the FUSE
emulator does for file systems. Both are loopback only, and both children
exit when their owner's pipe closes, so a killed owner leaves no process.
"""

from .owned import Owned
from .proxy import Fault, SlowProxy
from .server import ObjectStore

__all__ = ["Fault", "ObjectStore", "Owned", "SlowProxy"]
