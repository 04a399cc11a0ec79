"""``stager run``'s state file: one global position, agreed by every rank, written once.

The ranks of ``stager run`` do not step in lockstep, so when a run stops
(SIGTERM, preemption, ``run.max_batches``) they stand at different steps.
Each rank saving its own position would resume them at different points
with different numbers of steps left, which would deadlock a training loop
that synchronises every step. Instead every rank takes part in one
collective when its loop ends: the positions are gathered, the smallest (a
position every rank has reached) is the job's, and rank 0 writes it
atomically (temporary name, rename). A resuming run has rank 0 read it and
give it to every rank, so all start at one global position and, on any
number of ranks, take equal numbers of steps through the same global order.
"""

import glob
import json
import os

from .. import plan as planlib
from ..errors import StagerError
from ..world import agree


class StateFile:
    """The position a stopped run resumes from (``run.state_file``); ``load`` and ``settle`` are collective.

    Args:
        path: ``run.state_file``.
        world: The ``World``.
        samples: Catalog size.
        plan: The ``PlanConfig``.

    Raises:
        StagerError: With several ranks but no communicator, which could not
            agree on one position.
    """

    def __init__(self, path, world, samples, plan):
        if world.size > 1 and world.comm is None:
            raise StagerError(f"run.state_file {path} needs the {world.size} ranks to agree on one position, but "
                              f"this run has no communicator ({world.source}): start it under mpiexec, srun or "
                              "torchrun with world.backend auto, mpi or torch")
        self.path, self.world, self.samples, self.plan = path, world, samples, plan

    def _legacy(self):
        """Per-rank files (``<path>.rank<r>``) that stager 0.x wrote, rank by rank."""
        found = {}
        for name in glob.glob(glob.escape(self.path) + ".rank*"):
            suffix = name[len(self.path) + 5:]
            if suffix.isdigit():
                found[int(suffix)] = name
        return found

    def _read(self, path):
        try:
            with open(path, encoding="utf-8") as fh:
                return planlib.resume_position(json.load(fh), self.samples, self.plan), path
        except planlib.ResumeMismatch as exc:
            raise StagerError(f"run.state_file {path} was saved with {exc.key}={exc.saved!r}, this run has "
                              f"{exc.key}={exc.current!r}; remove it to start over") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StagerError(f"cannot read run.state_file {path}: {exc}") from None

    def _read_saved(self):
        if os.path.isfile(self.path):
            return self._read(self.path)[0]
        legacy = self._legacy()
        if not legacy:
            return planlib.Position()
        # Files of an older stager hold one position per rank; their smallest
        # is a position every rank reached, but only if no rank's is missing.
        with open(legacy[min(legacy)], encoding="utf-8") as fh:
            try:
                size = int(json.load(fh).get("world_size", 0))
            except (ValueError, TypeError, AttributeError):
                size = 0
        missing = sorted(set(range(size)) - set(legacy)) if size else ["?"]
        if missing:
            raise StagerError(f"run.state_file {self.path}: found per-rank files of an older stager "
                              f"({', '.join(sorted(os.path.basename(p) for p in legacy.values()))}) but not those "
                              f"of rank(s) {', '.join(map(str, missing))}, whose positions are unknown; remove "
                              f"{self.path}.rank* to start over")
        return min((self._read(p)[0] for p in legacy.values()), key=lambda p: (p.epoch, p.consumed))

    def load(self):
        """The ``plan.Position`` a stopped run saved (rank 0 reads it, every rank gets it), or the start."""
        return agree(self.world.comm, self._read_saved, StagerError)

    def settle(self, position, epochs):
        """Agrees on the job's position and saves it (collective: every rank calls it once, at its loop's end).

        Args:
            position: Where this rank's reading stands.
            epochs: ``plan.epochs`` (0: no end).

        Returns:
            ``(agreed, complete)``: the smallest position of all ranks, and
            whether it is the end of the plan (then the state is removed).
        """
        comm = self.world.comm
        mine = (position.epoch, position.consumed)
        agreed = planlib.Position(*min(comm.allgather(mine))) if comm is not None else position
        complete = bool(epochs) and agreed.epoch >= epochs
        # agree(): the other ranks wait until rank 0 has written (a rank that
        # exits first may get the job killed) and learn if it could not.
        agree(comm, lambda: self._remove() if complete else self._write(agreed),
              lambda text: StagerError(f"rank 0 could not write run.state_file {self.path}: {text}"))
        return agreed, complete

    def _write(self, position):
        tmp = f"{self.path}.part{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(planlib.resume_state(position, self.samples, self.plan, self.world.size), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._remove(legacy_only=True)

    def _remove(self, legacy_only=False):
        paths = list(self._legacy().values()) + ([] if legacy_only else [self.path])
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
