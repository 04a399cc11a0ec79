"""The job tools: ``stager run``'s loop, the demo, synthetic data, progress lines.

They drive the engine through its public names, as a user's training script
would.
"""

from .records import Recorder
from .state import StateFile
from .runner import run_job
from .source import ensure_synthetic, prepare_source
from .synth import MANIFEST, make_dataset

__all__ = ["MANIFEST", "Recorder", "StateFile", "ensure_synthetic", "make_dataset", "prepare_source", "run_job"]
