"""Runs in the training process, one per rank: the ``Pipeline`` its front end drives.

``pipeline`` (what a front end imports) and the ``Batch`` it yields
(``batch``), ``startup`` (the order things start in), ``coordinator`` (the
thread that asks for minibatches and hands them to readers) and ``shutdown`` (the written protocol that ends them).

Imported by ``stager.engine`` and the front ends through it. May import the
other engine packages (``node``, ``workers``, ``tuning``, ``perf``, ``peers``,
``group``) and the transport beside them (``messages``, ``wire``, ``batchfile``).
"""
