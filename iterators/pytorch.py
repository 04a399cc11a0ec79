"""A drop-in for ``torch.utils.data.DataLoader`` that stages the files of your own dataset.

Replace the class name::

    train = torchvision.datasets.ImageFolder(root, transform=T)
    loader = DataLoader(train, batch_size=256, shuffle=True, num_workers=8)      # before
    loader = StagedLoader(train, batch_size=256, shuffle=True, num_workers=8)    # after

``StagedLoader`` takes DataLoader's arguments, in DataLoader's order, with
DataLoader's meaning; the samples are your dataset's own (its loader and
transforms run in stager's reader processes on the staged copy of each
file). Under several ranks (torchrun, mpiexec, srun) each rank reads what
``DistributedSampler`` would give it, whether you pass one or not; a
``DistributedSampler`` you pass is honoured, its ``set_epoch`` included.
``set_epoch``, ``state_dict`` and ``load_state_dict`` give exact mid-epoch
resume, also on another number of ranks. The older form,
``StagedLoader(config)`` with a stager ``Config`` describing the dataset,
keeps working. What each argument does here is in docs/pytorch.md and
``_torch_args``; which datasets are accepted, in
``_torch_datasets``.
"""

import weakref

from torch.utils.data import IterableDataset, get_worker_info

from stager import Catalog, Pipeline
from stager import plan as planlib
from stager.config import Config
from stager.sources import SourceStalled
from stager.world import agree, detect

from ._source import resolve, staging_settings
from ._torch_args import Pin, PinCollated, can_pin, dataloader_rules, draw_seed, loader_plan, process_settings
from ._torch_datasets import Collate, TorchFiles
from ._torch_decoder import TorchDecoder
from ._torch_shards import ShardDataset

__all__ = ["ShardDataset", "StagedLoader"]

class StagedLoader(IterableDataset):
    """``DataLoader``'s interface over stager: files staged to node-local storage, then decoded and collated.

    Args (DataLoader's, with what each means here):
        dataset: A dataset that names its files: torchvision's
            ``DatasetFolder``/``ImageFolder``, one with ``stager_path`` and
            ``stager_load``, or ``Subset``/``ConcatDataset`` of those (see
            ``_torch_datasets``). Or, the older form, a stager ``Config``,
            dict of its values or ``Catalog`` describing the dataset.
        batch_size: Samples per minibatch on this rank; None yields single
            samples (``collate_fn`` then defaults to ``default_convert``).
        shuffle: Shuffle each epoch (``torch.randperm`` seeded with
            seed + epoch, as ``DistributedSampler``).
        sampler: None, ``SequentialSampler``, ``RandomSampler`` (over the
            whole dataset, without replacement) or ``DistributedSampler``
            (its seed, shuffle, drop_last and ``epoch`` are followed); any
            other is refused, since stager computes the order ahead.
        batch_sampler: Refused, for the same reason.
        num_workers: Reader processes decoding samples (0: the config's
            ``reader.workers``). stager's prefetchers are apart:
            ``staging.prefetchers`` of the node.
        collate_fn: As DataLoader; default ``default_collate``.
        pin_memory: Pin each batch in page-locked memory when an accelerator
            is present (as DataLoader, a warning and nothing otherwise).
        drop_last: Drop each epoch's short last minibatch.
        timeout: If positive, the longest wait for one minibatch (then
            ``RuntimeError``, as DataLoader) and for one file of the source
            (``staging.stall_timeout_s``: the error names the file).
        worker_init_fn: Called with the reader's index in each reader
            process before its first sample.
        multiprocessing_context: Start method of readers and prefetchers.
        generator: Its ``initial_seed()`` seeds the order; default: torch's
            default generator's (``torch.manual_seed``), rank 0's on all.
        prefetch_factor: Minibatches decoded ahead per reader (given, it
            overrides ``reader.ahead``; as DataLoader, only with workers).
        persistent_workers: Accepted where DataLoader accepts it: stager's
            readers always live across epochs.
        pin_memory_device: Where to pin (DataLoader's deprecated argument).
        in_order: Accepted: minibatches always come in plan order.

    Keyword-only, stager's own:
        config: Staging settings (local directory, capacity, prefetchers,
            peers...): a ``Config`` or dict; default ``$STAGER_CONFIG``'s
            YAML file, else stager's defaults.
        world: A ``stager.world.World``; default: detected.
        catalog: For the older form: a ``Catalog``; default: built on rank 0.
        pure_loader: True declares the ``loader`` of the ``DatasetFolder``
            datasets inside a pure function of the file's bytes (no
            randomness, no state, no other input), so that what it returns
            is kept as a decoded copy (``staging.decoded``, docs/decoded.md)
            as for torchvision's own loaders. Default: only those are.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, config=None, world=None, catalog=None, pure_loader=False):
        super().__init__()
        if isinstance(dataset, (Config, dict, Catalog)) and callable(batch_size):
            raise TypeError("StagedLoader's second argument is batch_size, as DataLoader's; pass the collate "
                            "function as collate_fn=")
        # DataLoader's own rules first: what it refuses is refused with its error, and its defaults are ours.
        rules = dataloader_rules(
            [None] if isinstance(dataset, (Config, dict, Catalog)) else dataset,
            batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order)
        self.batch_size, self.drop_last, self.sampler = rules.batch_size, rules.drop_last, sampler
        self.num_workers, self.timeout, self.worker_init_fn = num_workers, timeout, worker_init_fn
        self.prefetch_factor, self.persistent_workers, self.generator = (rules.prefetch_factor, persistent_workers,
                                                                         generator)
        self.multiprocessing_context, self.pin_memory_device, self.in_order = (rules.multiprocessing_context,
                                                                               pin_memory_device, in_order)
        self.collate_fn = rules.collate_fn
        self.pin_memory = pin_memory and can_pin()
        processes = process_settings(num_workers, prefetch_factor, timeout, rules.multiprocessing_context)
        self._sampler, self._decoder, self._seed_given = None, None, False
        if isinstance(dataset, (Config, dict, Catalog)):
            self.dataset = None
            self._described(dataset, shuffle, sampler, batch_sampler, generator, processes, config, world, catalog)
        else:
            if catalog is not None:
                raise TypeError("catalog= describes a stager dataset; a PyTorch dataset's files are its catalog")
            self.dataset = dataset
            self._from_dataset(dataset, shuffle, batch_sampler, processes, config, world, pure_loader)
        self._epoch = 0
        self._position = 0      # samples of the epoch's global order done, all ranks together
        self._pipe = None
        self._pipe_at = None    # (epoch, position) the pipeline delivers next
        self._finalizer = None

    def _described(self, dataset, shuffle, sampler, batch_sampler, generator, processes, config, world, catalog):
        """The older form: the dataset and its order in a stager config; given DataLoader arguments override it."""
        if config is not None:
            raise TypeError("config= gives the staging settings of a PyTorch dataset; here the dataset argument is "
                            "itself a stager config")
        if sampler is not None or batch_sampler is not None:
            raise TypeError("a stager config describes its own order (plan section): give no sampler")
        plan = {"epochs": 0}  # the training loop decides how many epochs to read
        if self.batch_size != 1:
            plan["batch_size"] = self.batch_size or 1
        if shuffle is not None:
            plan["shuffle"] = bool(shuffle)
        if self.drop_last:
            plan["drop_last"] = True
        if generator is not None:
            plan["seed"] = int(generator.initial_seed())
        self.config, self.world, self.catalog = resolve(dataset, world, catalog, {**processes, "plan": plan})
        self._seed_given = True

    def _from_dataset(self, dataset, shuffle, batch_sampler, processes, config, world, pure_loader):
        files = TorchFiles(dataset)
        base = staging_settings(config)
        world = world if world is not None else detect(base.world.mpi, base.world.backend)
        order = loader_plan(len(files), self.batch_size, shuffle, self.sampler, batch_sampler, self.drop_last,
                            self.generator, world, persistent=bool(self.persistent_workers and self.num_workers))
        self._sampler = order.sampler
        plan = dict(order.plan)
        window = files.shard_window()
        if window is not None and self.sampler is None and plan.get("shuffle"):
            plan.update(shuffle_algorithm="shards", shard_window=window)  # shard by shard, as sharded loaders read
        if "seed" not in plan:
            mine = draw_seed(order, self.generator, self.sampler)
            plan["seed"] = agree(world.comm, lambda: mine, lambda text: RuntimeError(text))
            self._seed_given = order.seed_from != "torch"
        else:
            self._seed_given = True
        overrides = {**processes, "plan": plan,
                     "dataset": {"source": files.root, "manifest": None, "catalog": None, **files.source_settings()}}
        self.config, self.world, self.catalog = resolve(base, world, None, overrides, files.catalog)
        # What the readers run (picklable when the datasets are).
        self._decoder = TorchDecoder(files.leaves, files.leaf_of, files.index_in, plan["seed"], self.worker_init_fn,
                                     dataset, Collate(self.collate_fn, single=self.batch_size is None), pure_loader)

    def set_epoch(self, epoch):
        """Chooses the epoch the next iteration reads (from its start unless resuming in it).

        Epochs also advance by themselves at the end of each iteration, so
        calling it is optional; calling it with the current epoch keeps a
        resumed position. With a ``DistributedSampler``, its ``set_epoch``
        does the same.

        Raises:
            ValueError: If ``epoch`` is not a non-negative integer.
        """
        planlib.check_count("epoch", epoch, "set_epoch()")
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0

    def __len__(self):
        """Minibatches of a whole epoch on this rank, as ``len(DataLoader)``: a resumed epoch yields fewer.

        Lightning and Accelerate's checkpoint examples count an epoch's
        steps with it, before and after a resume alike.
        """
        return self._left(0)

    def _left(self, position):
        """Minibatches this rank delivers in the current epoch from ``position``."""
        p = self.config.plan
        length = planlib.fitted_length(len(self.catalog), self.world.size, p.remainder, position)
        return planlib.step_count(length, p.batch_size, p.drop_last, self.world.size)

    def __iter__(self):
        if get_worker_info() is not None:
            raise RuntimeError("StagedLoader does its own loading in stager's reader processes: use it as "
                               "DataLoader(loader, batch_size=None, num_workers=0), or iterate it directly")
        if self._sampler is not None:
            self.set_epoch(self._sampler.epoch)
        if self._position and self._left(self._position) == 0:  # resumed exactly at the end of an epoch
            self._epoch, self._position = self._epoch + 1, 0
        epoch = self._epoch
        try:
            pipe = self._pipeline()
        except SourceStalled as exc:
            if not self.timeout:
                raise
            # The start's probe of the first files waited past ``timeout``: DataLoader's convention too.
            raise RuntimeError(f"StagedLoader timed out after {self.timeout} seconds waiting for a minibatch "
                               f"of epoch {epoch} (position {self._position}): {exc}") from exc
        while True:
            try:
                batch = pipe.take(self.timeout or None)
            except StopIteration:
                self._pipe = None
                return
            except TimeoutError:
                self._close_pipe()
                raise RuntimeError(f"StagedLoader timed out after {self.timeout} seconds waiting for a minibatch "
                                   f"of epoch {epoch} (position {self._position})") from None
            # The state must already say "after this batch" while the caller
            # holds it, so a checkpoint taken in the loop body resumes after it.
            self._position = batch.end
            self._pipe_at = (batch.epoch, batch.end)
            if batch.last:
                self._epoch, self._position = epoch + 1, 0
                self._pipe_at = (epoch + 1, 0)
            yield self._collate(batch)
            if batch.last:
                return

    def _collate(self, batch):
        if batch.collated:  # by the readers (and pinned by the pipeline's thread where asked)
            return batch.samples
        # A stager config's decoder, or a minibatch another job of the group decoded.
        out = self.collate_fn(batch.samples) if self.batch_size is not None else self.collate_fn(batch.samples[0])
        return Pin(self.pin_memory_device)(out) if self.pin_memory else out

    def _pipeline(self):
        # A pipeline closed by an error starts again from the position, so the
        # next iteration retries (and fails again) instead of yielding nothing.
        if self._pipe is None or self._pipe.closed or self._pipe_at != (self._epoch, self._position):
            self._close_pipe()
            # Minibatches the readers collated are pinned in the pipeline's receiving thread, as
            # DataLoader pins in a thread of its own: the training thread only takes them.
            finish = PinCollated(self.pin_memory_device) if self.pin_memory and self._decoder is not None else None
            self._pipe = Pipeline(self.config, self.catalog, world=self.world, loader=self._decoder,
                                  start=planlib.Position(self._epoch, self._position), finish=finish).start()
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

        A loader whose seed came from torch's default generator (no
        ``generator``, no ``DistributedSampler``) takes the saved seed, so
        a script that never called ``torch.manual_seed`` still resumes the
        same order.

        Raises:
            ValueError: If the state belongs to another dataset or order
                (sample count, seed or shuffle differ), or its epoch or
                position is not a non-negative integer, naming the key.
        """
        if not self._seed_given and isinstance(state, dict) and isinstance(state.get("seed"), int):
            self._adopt_seed(state["seed"])
        try:
            position = planlib.resume_position(state, len(self.catalog), self.config.plan, "state_dict")
        except planlib.ResumeMismatch as exc:
            raise ValueError(f"state_dict[{exc.key!r}] is {exc.saved!r} but this loader has {exc.current!r}: "
                             "it was saved for another dataset or order") from None
        self._epoch, self._position = position.epoch, position.consumed

    def _adopt_seed(self, seed):
        if seed != self.config.plan.seed:
            self._close_pipe()
            self.config = self.config.replace(plan={"seed": seed})
            if self._decoder is not None:
                self._decoder.seed = seed

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
