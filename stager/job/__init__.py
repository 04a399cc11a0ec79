"""The job tools: ``stager run``'s loop, the demo, synthetic data, progress lines.

They drive the engine through its public names, as a user's training script
would.
"""

from .records import Recorder
from .state import StateFile
from .runner import run_job
from .source import check_source, prepare_source, write_synthetic
from .synth import MANIFEST, make_dataset

__all__ = ["MANIFEST", "Recorder", "StateFile", "check_source", "make_dataset", "prepare_source", "run_job", "write_synthetic"]
