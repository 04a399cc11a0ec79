"""Handing prefetcher tasks to the pool earliest deadline first, across the node's ranks.

Ranks of a node train in step: each consumes its minibatch ``seq`` at about
the same time, so a task's deadline is its minibatch's sequence number in
its rank's plan. The service keeps its tasks here and puts on the pool's
shared queue only a few more than there are prefetchers, the earliest
deadlines first (ties: the order they came in). A rank that asked for many
minibatches ahead thus cannot fill the queue in front of a neighbour's
next minibatch: the node's prefetchers follow the ranks' demand, and no rank
of the node starves (Lobster's I/O balance).
"""

import heapq


class DeadlineQueue:
    """Tasks waiting for the pool, earliest deadline first.

    Args:
        put: Puts one task on the pool's shared queue.
        by_deadline: False hands tasks out in the order they came
            (``staging.node_schedule: arrival``), deadlines ignored.
    """

    def __init__(self, put, by_deadline=True):
        self._put = put
        self._by_deadline = by_deadline
        self._heap = []
        self._arrival = 0
        self._queued = set()  # task ids on the pool's queue or being fetched

    def __len__(self):
        return len(self._heap)

    @property
    def handed_out(self):
        """Tasks on the pool's queue or being fetched."""
        return len(self._queued)

    def push(self, deadline, task_id, task):
        """Keeps ``task`` (id ``task_id``) until a prefetcher is about to be free."""
        heapq.heappush(self._heap, (deadline if self._by_deadline else 0, self._arrival, task_id, task))
        self._arrival += 1

    def done(self, task_id):
        """A prefetcher replied for ``task_id`` (or the task was dropped)."""
        self._queued.discard(task_id)

    def feed(self, workers):
        """Puts tasks on the pool's queue until ``2 x workers`` are there or being fetched."""
        while self._heap and len(self._queued) < 2 * workers:
            _, _, task_id, task = heapq.heappop(self._heap)
            self._queued.add(task_id)
            self._put(task)

    def clear(self):
        self._heap.clear()
        self._queued.clear()
