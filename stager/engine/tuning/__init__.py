"""The controller: counts and look-ahead that follow what is measured, over the model in ``perf``.

``autocounts`` (``auto`` counts at start and the pool resizers while
running) and ``deepening`` (the look-ahead that deepens when the source
falls behind).

Imported by ``rank``. May import ``perf`` and ``workers.limits``; never ``rank`` nor ``node``.
"""
