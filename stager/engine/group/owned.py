"""The group's directories: the service's own, and the probe's copies a founding job makes for it."""

import fcntl
import os
import shutil

from ...storage.janitor import Janitor
from ...storage.leftovers import LOCK, sweep_at_start, write_owner


class OwnedDir:
    """A directory of the group's: made 0700 with an owner record, watched by a janitor (removed if its
    process dies). The service's own, and the probe's copies a founding job makes for it."""

    def __init__(self, base, name):
        sweep_at_start(base)  # services (or jobs) of this user that are gone
        self.path = os.path.join(base, name)
        os.mkdir(self.path, 0o700)
        self._lock = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        write_owner(self._lock, False)
        self.janitor = Janitor(self.path)

    def remove(self, stuck=()):
        """Removes the directory; safe twice."""
        if self._lock < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)
        self._lock = -1
        if stuck:
            self.janitor.hand_over()
        else:
            self.janitor.release()
