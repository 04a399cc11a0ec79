"""The whole configuration: one typed object, one section per concern."""

import dataclasses
from dataclasses import dataclass, field

from .job import RunConfig, SlowfsConfig, SlurmConfig, SyntheticConfig
from .library import DatasetConfig, PlanConfig, ReaderConfig, StagingConfig
from .runtime import ProcessesConfig, WorldConfig
from .schema import build, merge


@dataclass(frozen=True)
class Config:
    """The whole configuration; every section has defaults.

    The engine reads the library's sections (``dataset``, ``plan``,
    ``staging``, ``reader``, ``processes``, ``world``); the job tools read
    ``synthetic``, ``slowfs``, ``run`` and ``slurm``.
    """

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    slowfs: SlowfsConfig = field(default_factory=SlowfsConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    staging: StagingConfig = field(default_factory=StagingConfig)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    processes: ProcessesConfig = field(default_factory=ProcessesConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    run: RunConfig = field(default_factory=RunConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def to_dict(self):
        """Returns the configuration as nested plain dictionaries."""
        return dataclasses.asdict(self)

    def replace(self, **sections):
        """Returns a copy with some values changed, e.g. ``replace(plan={"epochs": 2})``."""
        return build(Config, merge(self.to_dict(), sections), base_dir=None, where="")
