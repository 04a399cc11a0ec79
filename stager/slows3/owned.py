"""A helper child process that says its port on its first line and ends when its owner's pipe closes."""

import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time


def serve_until_owner_leaves(port):
    """In the child: announces ``port`` on stdout and exits when stdin reaches end-of-file."""
    print(f"port {port}", flush=True)

    def watch():
        sys.stdin.buffer.read()  # returns at EOF: the owner closed its end, or died
        os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


class Owned:
    """A child ``python -m module args`` that serves on a loopback port until ``stop()``.

    Args:
        module: The child's module (it calls ``serve_until_owner_leaves``).
        args: Its command-line arguments.
        what: Its name in errors.
        start_timeout_s: How long it may take to announce its port.
    """

    def __init__(self, module, args, what, start_timeout_s=60.0):
        self.module, self.args, self.what, self.start_timeout_s = module, list(args), what, start_timeout_s
        self.proc, self.port = None, None
        self._log = None

    def start(self):
        """Starts the child and waits for its port.

        Raises:
            RuntimeError: If it exits or stays silent, with its error output.
        """
        self._log = tempfile.TemporaryFile()  # anonymous: nothing to clean up
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log)
        deadline = time.monotonic() + self.start_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(max(0.0, deadline - time.monotonic()))
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"{self.what} did not start: {self.log()[-2000:] or 'no output'}")
        self.port = int(line.split()[1])
        return self

    def log(self):
        """The child's error output so far."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def kill(self):
        """Kills the child at once (SIGKILL), as a crashed server would go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s=10.0):
        """Closes the owner's pipe, waits for the child to exit, kills it if it does not."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        finally:
            self.proc.stdout.close()
            self._log.close()
            self.proc, self._log = None, None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
