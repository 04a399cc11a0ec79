"""Runs in the prefetcher and reader processes, and the pools that start, resize and stop them.

``loops`` (the bodies both kinds of process run), ``pool`` (``WorkerPool``:
forking, pipes, retiring, the shutdown protocol), ``inflight`` (a
prefetcher's files in flight on threads), ``forksafe`` (what a forked child
resets) and ``limits`` (how many workers the node's descriptors and memory allow).

Imported by ``node``, ``rank``, ``tuning`` and ``group``. May import ``perf.clock``
and the transport (``messages``, ``wire``, ``batchfile``); never ``node`` nor ``rank``.
"""
