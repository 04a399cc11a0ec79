"""Runs in the node's staging service (a rank's thread, or the group daemon): what is staged when.

``service`` (the pool of prefetchers and the doorway ranks knock on),
``service_loop`` (its one loop over requests and replies), ``dispatch`` (which
file is fetched next, by deadline), and what it keeps track of while doing it:
``deadlines``, ``readpins`` and ``stalls``.

Imported by ``rank.startup`` and ``group``. May import ``workers``, ``peers``
and the transport (``messages``); never ``rank``.
"""
