"""The engine: the three stages, their transport and the node's staging service.

One rank's ``Pipeline`` walks its share of the plan on a coordinator thread
(stage 1's consumer), asks the node's staging service for each minibatch
ahead of the training loop, where prefetcher processes copy it to the job
directory (stage 2), and hands staged minibatches to reader processes that
decode them into shared memory (stage 3). A package for each place the
code runs: ``rank`` (the training process), ``node`` (the node's staging
service), ``workers`` (the prefetcher and reader processes and their pools),
``tuning`` (the counts that follow what is measured, over the rate model of
``perf``), ``peers`` (node leaders sharing their caches) and ``group`` (jobs
of one node sharing a service). What crosses between them lies loose here:
``messages``, ``wire`` and ``batchfile``.

May import: ``errors``, ``plan``, ``cache``, ``sources``, ``formats``,
``catalog``, ``world``, ``storage``, ``telemetry``. Never the tools nor the
front ends.
"""

from .rank.batch import Batch
from .rank.pipeline import Pipeline

__all__ = ["Batch", "Pipeline"]
