"""The rate model the engine tunes itself with: equations, a probe of the source, the tuner.

Pure equations over measured rates (``equations``), a short probe of a
source and the cores' load (``probe``), and the counts ``auto`` starts with
(``start``) and adjusts while running (``tune``). The ``stager whatif`` tool and the
simulator read the same model (``stager.model``).

May import: ``errors``, ``formats``.
"""

from .equations import Prediction, Rates, Settings, per_file_s, predict, predict_run
from .probe import cpu_ticks, machine, probe
from .start import MAX_IN_FLIGHT, choose_counts, count_limits, split_slots, start_split
from .tune import Decision, Tuner

__all__ = ["MAX_IN_FLIGHT", "Decision", "Prediction", "Rates", "Settings", "Tuner", "choose_counts", "count_limits", "cpu_ticks",
           "machine", "per_file_s", "predict", "predict_run", "probe", "split_slots",
           "start_split"]
