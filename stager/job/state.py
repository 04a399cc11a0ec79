"""``stager run``'s state file: one global position, agreed by every rank, written once.

The ranks of ``stager run`` do not step in lockstep, so when a run stops
(SIGTERM, preemption, a failure) they stand at different steps. Each rank
saving its own position would resume them at different points with
different numbers of steps left, which would deadlock a training loop that
synchronises every step. Instead the ranks agree: every ``run.state_every``
steps, and once when a rank leaves its loop, every rank takes part in one
gather of ``(position, leaving)``; the smallest position (one every rank has
reached) is the job's, and rank 0 writes it atomically (temporary name,
rename). When any rank is leaving (a stop signal, ``run.max_batches``, the
plan's end), every rank leaves after that same agreement, so each makes the
same number of collective calls whatever stopped it, and none waits for one
that never comes. A failing rank takes no part: the job ends (``MPI_Abort``)
and the last agreed position stands. A resuming run has rank 0 read the file
and give it to every rank, so all start at one global position and, on any
number of ranks, take equal numbers of steps through the same global order.
"""

CONTINUE, END, SIGNAL = 0, 1, 2  # why a rank comes to an agreement

import glob
import json
import os

from .. import plan as planlib
from ..errors import StagerError
from ..world import agree


class StateFile:
    """The position a stopped run resumes from (``run.state_file``); ``load`` and ``agree`` are collective.

    Args:
        path: ``run.state_file``.
        world: The ``World``.
        samples: Catalog size.
        plan: The ``PlanConfig``.
        every: ``run.state_every``: steps between agreements.
        epochs: ``plan.epochs`` (0: no end).

    Raises:
        StagerError: With several ranks but no communicator, which could not
            agree on one position.
    """

    def __init__(self, path, world, samples, plan, every=1, epochs=0):
        if world.size > 1 and world.comm is None:
            raise StagerError(f"run.state_file {path} needs the {world.size} ranks to agree on one position, but "
                              f"this run has no communicator ({world.source}): start it under mpiexec, srun or "
                              "torchrun with world.backend auto, mpi or torch")
        self.path, self.world, self.samples, self.plan = path, world, samples, plan
        self.every, self.epochs = every, epochs
        self._cleared = False

    def _legacy(self):
        """Per-rank files (``<path>.rank<r>``) that an older stager wrote, rank by rank."""
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
        return agree(self.world.comm, self._read_saved, lambda text: StagerError(f"on rank 0: {text}"))

    def agree(self, position, why, epochs=None):
        """One agreement (collective: every rank calls it at the same step count, or when it leaves).

        Args:
            position: Where this rank's reading stands.
            why: ``CONTINUE`` (a periodic agreement), ``END`` (this rank's loop
                ended: ``run.max_batches`` or the plan's end) or ``SIGNAL``
                (it was asked to stop).
            epochs: ``plan.epochs`` (0: no end); default: the constructor's.

        Returns:
            ``(agreed, why)``: the smallest position of all ranks, and the
            strongest reason among them; unless it is ``CONTINUE``, every rank
            leaves its loop now, rank 0 has saved ``agreed`` (or, at the end
            of the plan, removed the state) before any rank returns.
        """
        comm = self.world.comm
        epochs = self.epochs if epochs is None else epochs
        mine = (position.epoch, position.consumed, why)
        gathered = comm.allgather(mine) if comm is not None else [mine]
        agreed = planlib.Position(*min((e, c) for e, c, _ in gathered))
        why = max(w for _, _, w in gathered)
        if why == CONTINUE:
            if self.world.rank == 0:  # its failure ends the job (abort_on_error), the others need not wait
                self._write(agreed)
            return agreed, why
        complete = bool(epochs) and agreed.epoch >= epochs
        # agree(): the ranks wait until rank 0 has written (a rank that exits
        # first may get the job killed) and learn if it could not.
        agree(comm, lambda: self._remove() if complete else self._write(agreed),
              lambda text: StagerError(f"rank 0 could not write run.state_file {self.path}: {text}"))
        return agreed, why

    def _write(self, position):
        tmp = self.path + ".part"  # one name: a write cut short by a kill is overwritten, or removed, next time
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(planlib.resume_state(position, self.samples, self.plan, self.world.size), fh)
        os.replace(tmp, self.path)
        if not self._cleared:  # files of an older stager, replaced by this one
            self._remove(legacy_only=True)
            self._cleared = True

    def _remove(self, legacy_only=False):
        paths = list(self._legacy().values()) + ([] if legacy_only else [self.path, self.path + ".part"])
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
