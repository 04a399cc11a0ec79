"""The what-if tool over the engine's rate model: predictions for settings not run.

The equations, the probe and the tuner live in the engine
(``stager.engine.perf``), which tunes ``auto`` counts with them; this tool
adds what only a user's question needs: a run's totals as rates and the
cores free now (``calibrate``), a bounded cache's misses from replaying the
plan through the engine's own ``cache.Cache`` (``misses``), and the
``stager whatif`` table (``whatif``). The names of the engine's model are
re-exported here, where they have always been.

May import: the engine and the rooms below it.
"""

from .calibrate import from_summary
from .misses import cache_misses, step_misses
from ..engine.perf import (Decision, Prediction, Rates, Settings, Tuner, choose_counts, count_limits, machine, predict,
                           predict_run, probe)

__all__ = ["Decision", "Prediction", "Rates", "Settings", "Tuner", "cache_misses", "choose_counts", "count_limits",
           "from_summary", "machine", "predict", "predict_run", "probe", "step_misses"]
