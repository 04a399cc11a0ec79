"""Handing prefetcher tasks to the pool earliest deadline first, across the node's ranks.

Ranks of a node train in step: each consumes its minibatch ``seq`` at about
the same time, so a task's deadline is its minibatch's sequence number in
its rank's plan. The service keeps its tasks here and puts on the pool's
shared queue only a few more than the pool works on at once (tasks, or
their files where prefetchers keep several in flight), the earliest
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
        self._queued = {}  # task id -> its weight, for tasks on the pool's queue or being fetched
        self._weight = 0   # their weights' sum

    def __len__(self):
        return len(self._heap)

    @property
    def handed_out(self):
        """The weight of the tasks on the pool's queue or being fetched."""
        return self._weight

    def push(self, deadline, task_id, task, weight=1):
        """Keeps ``task`` (id ``task_id``) until a prefetcher is about to be free.

        ``weight``: what it takes of the pool's capacity (1 a task, or its files).
        """
        heapq.heappush(self._heap, (deadline if self._by_deadline else 0, self._arrival, task_id, weight, task))
        self._arrival += 1

    def done(self, task_id):
        """A prefetcher replied for ``task_id`` (or the task was dropped)."""
        self._weight -= self._queued.pop(task_id, 0)

    def feed(self, capacity):
        """Puts tasks on the pool's queue until their weights reach ``2 x capacity`` (the last may pass it)."""
        while self._heap and (not self._queued or self._weight < 2 * capacity):
            _, _, task_id, weight, task = heapq.heappop(self._heap)
            self._queued[task_id] = weight
            self._weight += weight
            self._put(task)

    def clear(self):
        self._heap.clear()
        self._queued.clear()
        self._weight = 0
