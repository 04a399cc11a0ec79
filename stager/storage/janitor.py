"""Removes a job's staging directory if its owner dies without doing so.

The owner (the node leader) starts a small Python process with a pipe on its standard input and keeps the write end. On a clean close the
owner removes the directory itself, writes ``done`` and closes the pipe; the
janitor exits. If the owner is killed (SIGKILL, ``MPI_Abort``, out of memory)
the kernel closes the pipe without ``done``, and the janitor removes the
directory. The janitor runs in its own session so that a kill aimed at the
owner's process group does not take it along.
"""

import subprocess
import sys

# Run with ``python -c`` so that the janitor imports nothing of stager: it
# starts in milliseconds and cannot be broken by the package's state.
_SCRIPT = """
import os, shutil, sys, time
# A line: the owner said it is done. EOF first: the owner died. (Waiting for
# EOF after "done" could last as long as any process forked from the owner
# keeps a copy of the pipe.)
message = sys.stdin.buffer.readline()
if not message.startswith(b"done"):
    # The owner's workers keep the pipe too, so EOF normally means they are
    # gone as well; a worker that did not inherit it may still be finishing a
    # copy, hence a few tries.
    for attempt in range(20):
        shutil.rmtree(sys.argv[1], ignore_errors=True)
        if not os.path.lexists(sys.argv[1]):
            break
        time.sleep(0.5)
"""


class Janitor:
    """Owns the janitor process of one directory."""

    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, start_new_session=True)

    def fileno(self):
        """The owner's end of the pipe; workers that write into the directory keep it open."""
        return self.proc.stdin.fileno() if self.proc is not None else None

    def hand_over(self):
        """Leaves the directory to the janitor: it removes it once every process holding its pipe is gone.

        For an owner that leaves workers stuck in the kernel behind: they
        hold the pipe, so the janitor waits for them, however long.
        """
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        proc.stdin.close()  # not waited for: it runs in its own session and may outlive us

    def release(self, timeout_s=10.0):
        """Tells the janitor the owner cleaned up (or keeps the directory) and waits for it."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            proc.stdin.write(b"done\n")
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

