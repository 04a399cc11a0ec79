"""stager as a data loader of DLIO (``dlio_benchmark``), the engine of MLPerf Storage.

Run any PyTorch workload of DLIO through stager by naming this class::

    dlio_benchmark workload=unet3d_h100 \\
        ++workload.reader.data_loader_classname=iterators.dlio.StagedDataLoader \\
        ++workload.reader.data_loader_sampler=index

DLIO then hands stager its training (and evaluation) file list, batch
size, seed and shuffle, read threads (stager's readers), epochs, and its
rank among ``comm_size`` under ``mpirun``; stager stages each rank's
share to node-local storage minibatch by minibatch (a node stages a file
once for its ranks) and hands DLIO its batches, while DLIO emulates the
accelerator and reports its utilisation (AU). Staging settings come from
the workload's ``stager`` section (``++workload.stager.staging.prefetchers=8``)
on top of ``$STAGER_CONFIG``'s file, else stager's defaults. After the
last epoch, the stall report of each loader is written to DLIO's output
folder (``stager-train.json``, ``stager-eval.json``: ``stager report``
reads them). What is read, and how, is in ``_dlio_files`` and docs/dlio.md.
"""

import os
import secrets

import torch
from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType, Shuffle
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
from dlio_benchmark.utils.utility import DLIOMPI

from stager.world import abort_on_error, detect

from ._dlio_files import DLIOFiles, collate, workload_section
from ._source import staging_settings
from .pytorch import StagedLoader

__all__ = ["StagedDataLoader"]


def _evaluations(args):
    """How many times DLIO's run evaluates: its ``run`` loop's rule, counted ahead."""
    if not args.do_eval:
        return 0
    count, due = 0, args.eval_after_epoch
    for epoch in range(1, args.epochs + 1):
        if epoch >= due:
            count, due = count + 1, due + args.epochs_between_evals
    return count


class StagedDataLoader(BaseDataLoader):
    """A DLIO data loader that reads DLIO's files through stager's staging pipeline.

    DLIO builds one for training and one for evaluation
    (``DataLoaderFactory``), calls ``read()`` once before the first epoch,
    ``next()`` for each epoch (or evaluation), and ``finalize()`` after each.
    The pipeline lives across epochs, so each epoch's first minibatches are
    staged while the previous one ends; it is closed (and its report
    written) at the last ``finalize()``.

    Args (DLIO's, from its ``DataLoaderFactory``):
        format_type: ``dataset.format`` (npz, npy, hdf5, jpeg or png).
        dataset_type: DLIO's ``DatasetType.TRAIN`` or ``DatasetType.VALID``.
        epoch_number: The first epoch (DLIO counts from 1).
    """

    def __init__(self, format_type, dataset_type, epoch_number):
        super().__init__(format_type, dataset_type, epoch_number, DataLoaderType.CUSTOM)
        self.training = dataset_type is DatasetType.TRAIN
        self.loader = None
        self.world = None
        self.runs = 0     # next() calls so far: epochs (training) or evaluations
        self.closed = False

    def read(self):
        """Builds the loader over DLIO's file list (collective under MPI: every rank calls it).

        Here and in ``next`` and ``finalize``, an error on one rank of several
        ends the whole job (``MPI_Abort``) after printing it: DLIO's Hydra
        wrapper would catch it and exit, leaving the other ranks waiting in
        DLIO's next barrier until the allocation ends.
        """
        args = self._args
        files = args.file_list_train if self.training else args.file_list_eval
        if self.loader is not None or not files:
            return
        settings = staging_settings(None)
        self.world = detect(settings.world.mpi, settings.world.backend)
        with abort_on_error(self.world):
            section = workload_section()
            if section:
                settings = settings.replace(**section)
            where = "training" if self.training else "evaluation"
            dataset = DLIOFiles(files, args.num_samples_per_file, str(args.format),
                                (args.preprocess_time, args.preprocess_time_stdev), where)
            seed = args.seed
            if args.sample_shuffle is Shuffle.RANDOM:  # DLIO draws anew each run; every rank takes rank 0's draw
                seed = DLIOMPI.get_instance().comm().bcast(secrets.randbits(62), root=0)
            generator = torch.Generator()
            generator.manual_seed(int(seed))
            loader = StagedLoader(dataset, batch_size=self.batch_size, shuffle=args.sample_shuffle is not Shuffle.OFF,
                                  num_workers=max(int(args.read_threads), 0), collate_fn=collate, drop_last=True,
                                  generator=generator, prefetch_factor=self._ahead(), config=settings,
                                  world=self.world)
            # The run's length is known: the pipeline stops staging after its last epoch instead of staging
            # the start of one that never comes.
            loader.config = loader.config.replace(plan={"epochs": self._last(args)})
            self.loader = loader

    def _last(self, args):
        """How many times ``next()`` will be called: DLIO's epochs, or its evaluations."""
        return int(args.epochs) if self.training else _evaluations(args)

    def _ahead(self):
        """Minibatches decoded ahead per reader: DLIO's prefetch size over its read threads, as its loader sets."""
        threads, size = int(self._args.read_threads), int(self._args.prefetch_size)
        if threads < 1:
            return None
        return max(-(-size // threads), 1) if size > 0 else 2

    def next(self):
        """Yields one epoch's (or one evaluation's) batches of this rank, in stager's plan order."""
        super().next()
        if self.loader is None:
            self.read()
        if self.closed:
            raise RuntimeError(f"iterators.dlio.StagedDataLoader: next() after the last "
                               f"{'epoch' if self.training else 'evaluation'} was finalized")
        # DLIO counts epochs from 1; the plan's epoch e is seeded with seed + e. A loop that DLIO cut short
        # (total_training_steps) leaves the loader mid-epoch: the next one starts from its beginning.
        self.loader.set_epoch(self.epoch_number - 1 + self.runs)
        self.runs += 1
        with abort_on_error(self.world):
            yield from self.loader

    def finalize(self):
        """Ends an epoch; after the last one, writes the stall report and stops the pipeline (collective)."""
        if self.loader is None or self.closed or self.runs < self._last(self._args):
            return
        self.closed = True
        with abort_on_error(self.world):
            try:
                if self.loader.stats is not None:
                    name = "stager-train.json" if self.training else "stager-eval.json"
                    self.loader.report(os.path.join(self._args.output_folder, name))
            finally:
                self.loader.close()
