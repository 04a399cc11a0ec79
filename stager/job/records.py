"""What a ``stager run`` job writes: records of what was read and staged, and its resume state."""

import glob
import json
import os

from .. import plan as planlib
from ..errors import StagerError


class Recorder:
    """Writes what was read (``rank-<r>.jsonl``) and, on node leaders, what was staged
    (``staged-<node>.jsonl``) and the node cache's counters per epoch (``cache-<node>.jsonl``)."""

    def __init__(self, directory, catalog, world):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.node = directory, world.node
        self.catalog = catalog
        self._reads = open(os.path.join(directory, f"rank-{world.rank}.jsonl"), "w", encoding="utf-8")
        self._staged = None
        if world.node_leader:
            self._staged = open(os.path.join(directory, f"staged-{world.node}.jsonl"), "w", encoding="utf-8")

    def batch(self, batch):
        paths = [self.catalog.path(i) for i in batch.indices]
        self._reads.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "samples": paths}) + "\n")

    def cache(self, table):
        """Writes the node cache's per-epoch counters (``cache-<node>.jsonl``, node leaders)."""
        if self._staged is None:
            return
        with open(os.path.join(self.directory, f"cache-{self.node}.jsonl"), "w", encoding="utf-8") as fh:
            for row in table:
                fh.write(json.dumps(row) + "\n")

    def staged(self, rel, nbytes, epoch):
        self._staged.write(json.dumps({"path": rel, "bytes": nbytes, "epoch": epoch}) + "\n")

    def close(self):
        self._reads.close()
        if self._staged is not None:
            self._staged.close()


class StateFile:
    """The position a stopped run resumes from (``run.state_file``).

    It holds ``plan.resume_state``, the same state ``StagedLoader.state_dict``
    saves, so a run resumes on the same or another number of ranks. Under
    MPI each rank saves its own position to ``<path>.rank<r>``; a resuming
    rank takes the smallest position found among all of them, which every
    rank has reached, so all ranks resume at one global position and take
    equal numbers of steps.

    Args:
        path: ``run.state_file``.
        world: The ``World``.
        samples: Catalog size.
        plan: The ``PlanConfig``.
    """

    def __init__(self, path, world, samples, plan):
        self.base = path
        self.path = path + (f".rank{world.rank}" if world.size > 1 else "")
        self.world, self.samples, self.plan = world, samples, plan

    def _saved(self):
        paths = [self.base] + sorted(glob.glob(glob.escape(self.base) + ".rank*"))
        return [p for p in paths if os.path.isfile(p) and not p.endswith(".part")]

    def load(self):
        """Returns the ``plan.Position`` saved by a stopped run, or the start."""
        positions = []
        for path in self._saved():
            try:
                with open(path, encoding="utf-8") as fh:
                    state = json.load(fh)
                positions.append(planlib.resume_position(state, self.samples, self.plan))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                if isinstance(exc, planlib.ResumeMismatch):
                    raise StagerError(f"run.state_file {path} was saved with {exc.key}={exc.saved!r}, this run "
                                      f"has {exc.key}={exc.current!r}; remove it to start over") from None
                raise StagerError(f"cannot read run.state_file {path}: {exc}") from None
        return min(positions, key=lambda p: (p.epoch, p.consumed)) if positions else planlib.Position()

    def save(self, position):
        tmp = self.path + ".part"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(planlib.resume_state(position, self.samples, self.plan, self.world.size), fh)
        os.replace(tmp, self.path)

    def remove(self):
        """Removes this rank's state (rank 0: every rank's, and those of an earlier, larger run)."""
        for path in self._saved() if self.world.rank == 0 else [self.path]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
