"""A started pipeline, read on a helper thread so that the consumer can time its wait.

``Pipeline.__next__`` blocks until the next minibatch is decoded. Chainer's
``MultiprocessIterator`` warns (``TimeoutWarning``) in the consumer's thread
while it waits longer than ``dataset_timeout``, so that
``warnings.simplefilter('error', ...)`` turns a stall into an exception
there. The consumer therefore waits on a queue with a timeout while a helper
thread does the blocking ``next()``.

Neither the feed nor its thread refers to the iterator, so the iterator can
be collected while they run; ``release`` is what its finalizer calls.
"""

import queue
import threading


class Feed:
    """Hands out a pipeline's minibatches one request at a time.

    One request at a time keeps the pipeline's own bookkeeping of what the
    consumer has taken exact, so its lookahead stays bounded.

    Args:
        pipeline: A started ``stager.Pipeline``.
        failures: The list its plan records a failure in (see
            ``_chainer_orders.minibatches``).
        join_timeout: Seconds to wait for the helper thread at ``close()``.
    """

    def __init__(self, pipeline, failures, join_timeout):
        self.failures = failures
        self._pipe = pipeline
        self._join_timeout = join_timeout
        self._requests = queue.SimpleQueue()
        self._replies = queue.SimpleQueue()
        self._pending = False
        self._thread = threading.Thread(target=_serve, args=(pipeline, self._requests, self._replies),
                                        name="stager-chainer-feed", daemon=True)
        self._thread.start()

    @property
    def closed(self):
        """Whether the pipeline closed (an error, the end of its plan, or ``close()``)."""
        return self._pipe.closed

    def get(self, timeout, on_stall):
        """Returns the next ``Batch``, or None once the plan has ended.

        Args:
            timeout: Seconds between calls of ``on_stall`` while waiting, or
                None to wait without them.
            on_stall: Called with the seconds waited so far. If it raises, the
                request stays outstanding and the next ``get`` collects it.

        Raises:
            Exception: The pipeline's error (``stager.StageError``).
        """
        if not self._pending:
            self._requests.put(True)
            self._pending = True
        waited = 0.0
        while True:
            try:
                ok, value = self._replies.get(timeout=timeout)
            except queue.Empty:
                waited += timeout
                on_stall(waited)
                continue
            self._pending = False
            if ok:
                return value
            raise value

    def close(self):
        """Stops the pipeline's processes and the helper thread; safe to call twice."""
        self._requests.put(None)
        self._pipe.close()  # also wakes a next() blocked in the helper thread
        if self._thread is not threading.current_thread():
            self._thread.join(self._join_timeout)


def _serve(pipeline, requests, replies):
    while requests.get() is not None:
        try:
            replies.put((True, next(pipeline)))
        except StopIteration:
            replies.put((True, None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer's thread
            replies.put((False, exc))


def release(feed):
    """Closes a feed whose iterator was collected without ``finalize()``.

    The cyclic garbage collector runs in whichever thread triggers it, which
    may be the pipeline's coordinator (it cannot join itself) or the feed's
    own thread; only the main thread closes synchronously, any other hands
    the work to a thread of its own.
    """
    if threading.current_thread() is threading.main_thread():
        feed.close()
    else:
        # Not a daemon (it would inherit that from a daemon thread): the
        # interpreter must not exit halfway through the shutdown.
        threading.Thread(target=feed.close, name="stager-chainer-release", daemon=False).start()
