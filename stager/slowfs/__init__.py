"""The emulated slow shared file system (a tool: tests, demo and benchmark use it).

A read-only FUSE passthrough that adds a latency to every open and shares one
bandwidth cap among all readers; ``SlowFS`` mounts it for a ``with`` block.
"""

from .engine import ENGINES, EngineUnavailable, build_c_engine, c_engine_path, engine_command
from .mount import FSNAME, SlowFS, fusermount, mount, mount_entry, umount

__all__ = ["ENGINES", "EngineUnavailable", "FSNAME", "SlowFS", "build_c_engine", "c_engine_path",
           "engine_command", "fusermount", "mount", "mount_entry", "umount"]
