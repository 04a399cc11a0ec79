"""A PyTorch data source that stages files: iterate it like a ``DataLoader``.

``StagedLoader`` yields this rank's collated minibatches, one epoch per
``for`` loop. stager's readers do the loading, so no DataLoader worker
processes are needed; it is also an ``IterableDataset``, usable as
``DataLoader(loader, batch_size=None)``. ``set_epoch``, ``state_dict`` and
``load_state_dict`` give exact mid-epoch resume, also on another number of
ranks: the same global order continues from the same global position.
"""

import weakref

from torch.utils.data import IterableDataset, default_collate, get_worker_info

from stager import plan as planlib
from stager.engine import Pipeline

from ._source import resolve


class StagedLoader(IterableDataset):
    """This rank's minibatches, staged and decoded by stager, collated for PyTorch.

    ``plan.epochs`` is ignored: the loader serves as many epochs as the
    training loop asks for. The staging pipeline lives across epochs (files staged in one epoch are
    read locally in the next, and the next epoch is staged ahead); it starts
    at the first iteration and stops at ``close()``.

    Args:
        config: A stager ``Config`` (or a dict of its values).
        collate_fn: Turns a list of samples into a batch; default:
            ``torch.utils.data.default_collate`` (labelled samples become
            ``(data, labels)`` tensors, copies that the caller owns outright).
            The samples it gets are views of a reader's shared memory, each
            slot reused only once every array from it is gone (``stager.engine.wire``),
            so a collate that keeps them (``torch.from_numpy``) is safe too and
            holds that memory as long as its batch lives.
        world: A ``stager.world.World``; default: detected (MPI when launched
            by mpiexec/srun).
        catalog: A ``stager.Catalog``; default: built on rank 0 and broadcast.
    """

    def __init__(self, config, collate_fn=None, world=None, catalog=None):
        super().__init__()
        # The training loop decides how many epochs to read.
        self.config, self.world, self.catalog = resolve(config, world, catalog, {"plan": {"epochs": 0}})
        self.collate_fn = collate_fn or default_collate
        self._epoch = 0
        self._position = 0      # samples of the epoch's global order done, all ranks together
        self._pipe = None
        self._pipe_at = None    # (epoch, position) the pipeline delivers next
        self._finalizer = None

    def set_epoch(self, epoch):
        """Chooses the epoch the next iteration reads (from its start unless resuming in it).

        Epochs also advance by themselves at the end of each iteration, so
        calling it is optional; calling it with the current epoch keeps a
        resumed position.

        Raises:
            ValueError: If ``epoch`` is not a non-negative integer.
        """
        planlib.check_count("epoch", epoch, "set_epoch()")
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0

    def __len__(self):
        """Minibatches this rank delivers in the current epoch from the current position."""
        p = self.config.plan
        length = planlib.fitted_length(len(self.catalog), self.world.size, p.remainder, self._position)
        return planlib.step_count(length, p.batch_size, p.drop_last, self.world.size)

    def __iter__(self):
        if get_worker_info() is not None:
            raise RuntimeError("StagedLoader does its own loading in stager's reader processes: use it as "
                               "DataLoader(loader, batch_size=None, num_workers=0), or iterate it directly")
        if self._position and len(self) == 0:  # resumed exactly at the end of an epoch
            self._epoch, self._position = self._epoch + 1, 0
        pipe = self._pipeline()
        epoch = self._epoch
        while True:
            try:
                batch = next(pipe)
            except StopIteration:
                self._pipe = None
                return
            # The state must already say "after this batch" while the caller
            # holds it, so a checkpoint taken in the loop body resumes after it.
            self._position = batch.end
            self._pipe_at = (batch.epoch, batch.end)
            if batch.last:
                self._epoch, self._position = epoch + 1, 0
                self._pipe_at = (epoch + 1, 0)
            yield self.collate_fn(batch.samples)
            if batch.last:
                return

    def _pipeline(self):
        # A pipeline closed by an error starts again from the position, so the
        # next iteration retries (and fails again) instead of yielding nothing.
        if self._pipe is None or self._pipe.closed or self._pipe_at != (self._epoch, self._position):
            self._close_pipe()
            self._pipe = Pipeline(self.config, self.catalog, world=self.world,
                                  start=planlib.Position(self._epoch, self._position)).start()
            self._pipe_at = (self._epoch, self._position)
            # A loader still alive at interpreter exit (a global, a reference
            # cycle) would be collected after the modules that its shutdown
            # needs are gone; the finalizer closes the pipeline before that.
            self._finalizer = weakref.finalize(self, self._pipe.close)
        return self._pipe

    @property
    def stats(self):
        """The running pipeline's ``stager.telemetry.Stats`` (stall time, files staged), or None."""
        return self._pipe.stats if self._pipe is not None else None

    def report(self, path=None):
        """The stall report's JSON for the loop so far, as ``stager run --report`` writes it.

        Collective under MPI or torchrun: every rank calls it; rank 0 writes
        ``path``. Call it right after the loop (inside ``with``, before
        ``close()``): the time since the last minibatch counts as that step's
        compute. ``stager report PATH`` reads the file.

        Args:
            path: JSON file to write (rank 0), or None.

        Returns:
            On rank 0 the job's report (a dict), elsewhere this rank's summary.

        Raises:
            RuntimeError: No pipeline is running (not iterated yet, or closed).
        """
        if self._pipe is None:
            raise RuntimeError("StagedLoader.report(): no pipeline is running; iterate the loader first and "
                               "call report() before close()")
        from stager.telemetry import pipeline_report

        return pipeline_report(self._pipe, self.config, path)

    def state_dict(self):
        """The position to resume from: after the last minibatch yielded (``stager.plan.resume_state``)."""
        return planlib.resume_state(planlib.Position(self._epoch, self._position), len(self.catalog),
                                    self.config.plan, self.world.size)

    def load_state_dict(self, state):
        """Resumes from ``state_dict()``'s position, on any number of ranks.

        Raises:
            ValueError: If the state belongs to another dataset or order
                (sample count, seed or shuffle differ), or its epoch or
                position is not a non-negative integer, naming the key.
        """
        try:
            position = planlib.resume_position(state, len(self.catalog), self.config.plan, "state_dict")
        except planlib.ResumeMismatch as exc:
            raise ValueError(f"state_dict[{exc.key!r}] is {exc.saved!r} but this loader has {exc.current!r}: "
                             "it was saved for another dataset or order") from None
        self._epoch, self._position = position.epoch, position.consumed

    def close(self):
        """Stops the staging pipeline; safe to call twice."""
        self._close_pipe()

    def _close_pipe(self):
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
            self._pipe_at = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

