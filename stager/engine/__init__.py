"""The engine: the three stages, their transport and the node's staging service.

One rank's ``Pipeline`` walks its share of the plan on a coordinator thread
(stage 1's consumer), asks the node's staging service for each minibatch
ahead of the training loop, where prefetcher processes copy it to the job
directory (stage 2), and hands staged minibatches to reader processes that
decode them into shared memory (stage 3). Messages between them are in
``messages``; the service and its loop in ``service``/``service_loop``; the
workers' bodies in ``workers``; node leaders sharing their caches in
``peers``; the counts that tune themselves in ``autocounts`` over the rate
model of ``perf``.

May import: ``errors``, ``plan``, ``cache``, ``sources``, ``formats``,
``catalog``, ``world``, ``storage``, ``telemetry``. Never the tools nor the
front ends.
"""

from .coordinator import Batch
from .pipeline import Pipeline

__all__ = ["Batch", "Pipeline"]
