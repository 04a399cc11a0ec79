"""A small performance model of the three stages: what-if predictions and ``auto`` counts.

Pure functions over measured rates (``equations.py``, where the equations
are written out); the rates come from a short probe of the source and from a
run's totals (``calibrate.py``); a bounded cache's misses from replaying the
plan (``misses.py``); the counts ``auto`` picks and adjusts (``tune.py``);
the ``stager whatif`` table (``whatif.py``).
"""

from .calibrate import from_summary, machine, probe
from .equations import Prediction, Rates, Settings, predict, predict_run
from .misses import cache_misses, step_misses
from .tune import Decision, Tuner, choose_counts, count_limits

__all__ = ["Decision", "Prediction", "Rates", "Settings", "Tuner", "cache_misses", "choose_counts", "count_limits",
           "from_summary", "machine", "predict", "predict_run", "probe", "step_misses"]
