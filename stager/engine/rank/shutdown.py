"""The shutdown protocol of a rank's pipeline, step by step.

Shutdown protocol (``close()``, idempotent and thread-safe; also on an error
in any stage, at the end of the plan, on leaving a ``with`` block, and when
an abandoned pipeline is collected):
  1. stop the coordinator (halt event plus a wake-up) and join it;
  2. tell the staging service goodbye (and, on an error, why); a shared
     group's service (``staging.share``) is given ``ch.linger`` seconds to
     hang up, which the last job's service does once it has removed
     everything;
  3. set the readers' stop event, send one ``None`` sentinel per reader and
     close their reply pipes (a reader drops the minibatch it holds); join
     each until ``processes.shutdown_timeout_s``, then terminate, then kill;
  4. on the node leader: wait (up to ``processes.peer_wait_s``, not at all
     on an error) for the node's other ranks to leave the service, stop the
     prefetchers the same way, and remove the job directory unless
     ``staging.keep`` is set.
A worker that survives SIGKILL (stuck in the kernel on a hung file system)
is reported and left behind: shutdown never waits for it. The job directory
is removed all the same, and the janitor, whose pipe such a prefetcher still
holds, removes it once more when the prefetcher is finally gone.
At the end of the plan, the coordinator thread runs the protocol once it has
delivered the last minibatch (``Pipeline._finish``) while the consumer takes
the last ones; its last ``next()`` waits for it. Whoever comes first among
``close()``, that close and the finaliser runs the protocol (``ch.claim()``);
the others wait for it to end.
Workers also exit on their own when their parent dies (they poll getppid).
"""

import contextlib
import time

from .coordinator import END
from ..messages import Bye, Fail


def halt(ch):
    """Step 1: the coordinator and a consumer blocked in ``next()`` stop waiting."""
    ch.halt.set()
    ch.out.put(END)  # wakes a consumer blocked in next() on another thread
    ch.wake.notify(None)


def stop(ch, timeout, peer_wait_s, reason=None):
    """Steps 2-4 of the shutdown protocol (the coordinator is already halted).

    Returns:
        The pids of workers stuck in the kernel and left running.
    """
    stuck = []
    if ch.client is not None:
        # A coordinator stuck in a send would hold the lock: then skip the goodbye.
        if ch.client_lock.acquire(timeout=timeout):
            try:
                with contextlib.suppress(OSError, EOFError, ValueError):
                    if reason is not None:
                        ch.client.send(Fail(reason))
                    ch.client.send(Bye())
                    _linger(ch.client, ch.linger)
                ch.client.close()
            finally:
                ch.client_lock.release()
    if ch.readers is not None:
        stuck += ch.readers.stop(timeout)
    if ch.service is not None:
        stuck += ch.service.close(peer_wait_s)
    ch.wake.close()
    return stuck


def _linger(client, seconds):
    """Waits up to ``seconds`` for the service to hang up: a shared group's, once it removed all (if last)."""
    deadline = time.monotonic() + seconds
    while seconds and client.poll(max(0.0, deadline - time.monotonic())):
        client.recv()  # a late answer, or end-of-file (EOFError) once the service let go
        if time.monotonic() >= deadline:
            return


def close_abandoned(ch, jobdirs):
    """The whole protocol for a pipeline nobody closed."""
    # Runs when an unclosed pipeline is collected, or at interpreter exit:
    # stop without waiting for peers, and quietly (the interpreter may be
    # half torn down); the janitor removes a directory this cannot.
    if not ch.claim():
        # The close at the end of the plan is under way on the coordinator thread, which runs on
        # through the interpreter's exit handlers: the directory goes when it is done.
        ch.shut.wait()
        return
    try:
        with contextlib.suppress(Exception):
            halt(ch)
            stuck = stop(ch, 1.0, 0)
            for jobdir in jobdirs:
                jobdir.remove(stuck)
    finally:
        ch.shut.set()
