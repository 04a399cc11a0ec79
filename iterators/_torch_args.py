"""DataLoader's arguments, each mapped onto stager's settings or refused with why and what to use.

``loader_plan`` turns the arguments that decide the order (``batch_size``,
``shuffle``, ``sampler``, ``batch_sampler``, ``drop_last``, ``generator``)
into the plan's settings; ``process_settings`` the ones that decide the
processes (``num_workers``, ``prefetch_factor``, ``timeout``,
``multiprocessing_context``). The order is ``DistributedSampler``'s: each
epoch ``torch.randperm`` seeded with seed + epoch (``shuffle_algorithm:
torch``), rank r reading every world-size-th sample from r (``split:
strided``), padded or cut to the ranks as its ``drop_last`` says. One
process shuffling from a fresh generator seeded with ``s`` (``generator=``,
or a ``RandomSampler``'s) reads DataLoader's own order of that generator
instead (``torch_loader``, ``torch_loader_persistent``, ``torch_sampler``:
``stager/plan/shuffles/torch_generator.py``).

Before either, ``dataloader_rules`` builds a ``DataLoader`` from the same
arguments, so that what DataLoader refuses is refused with DataLoader's own
error, and its defaults (``prefetch_factor``, ``collate_fn``, ...) are its
own: the rules are torch's, not a copy of them.
"""

from dataclasses import dataclass
from typing import Optional

import warnings

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler


@dataclass(frozen=True)
class Order:
    """What the arguments say about the order.

    Attributes:
        plan: The ``plan`` section's values.
        seed_from: ``sampler`` (a ``DistributedSampler``'s seed),
            ``generator`` (its ``initial_seed()``) or ``torch`` (the default
            generator's ``initial_seed()``, agreed from rank 0).
        sampler: A ``DistributedSampler`` whose ``epoch`` each iteration
            follows, or None.
    """

    plan: dict
    seed_from: str
    sampler: Optional[DistributedSampler] = None


def _check_distributed(sampler, world, length):
    if sampler.num_replicas != world.size or sampler.rank != world.rank:
        raise ValueError(f"the DistributedSampler says rank {sampler.rank} of {sampler.num_replicas}, but this "
                         f"process is rank {world.rank} of {world.size} in stager's world (world.backend): build "
                         f"the sampler in the same job that runs the loader, or leave it out (StagedLoader gives "
                         f"each rank its DistributedSampler share by itself)")
    if len(sampler.dataset) != length:
        raise ValueError(f"the DistributedSampler's dataset has {len(sampler.dataset)} samples, the loader's "
                         f"{length}: give both the same dataset")


def can_pin():
    """Whether batches can be pinned: an accelerator is present (else DataLoader's warning, and no pinning)."""
    if torch.accelerator.is_available():
        return True
    warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                  "won't be used.")
    return False


class Pin:
    """Pins a minibatch in page-locked memory, as DataLoader's pinning thread does (on ``device``, if named)."""

    def __init__(self, device=""):
        self.device = device or None

    def __call__(self, out):
        from torch.utils.data._utils.pin_memory import pin_memory  # what DataLoader's pinning thread calls

        return pin_memory(out, self.device)

    def __repr__(self):
        return f"pin_memory(device={self.device!r})"


class PinCollated(Pin):
    """The pipeline's ``finish``: pins a ``Batch`` the readers collated; the rest is collated, then pinned, later."""

    def __call__(self, batch):
        return super().__call__(batch.samples) if batch.collated else batch.samples


def dataloader_rules(dataset, **arguments):
    """DataLoader's own checks and defaults for these arguments: the ``DataLoader`` they make.

    Building one starts no process and reads no sample. ``dataset`` is the
    user's; the older form passes a one-sample stand-in, whose order the
    stager config describes.

    Raises:
        ValueError, TypeError: What ``DataLoader`` raises, as it raises it.
    """
    return DataLoader(dataset, **arguments)


def _fresh(generator):
    """True for a generator nothing has drawn from since it was seeded (its sequence follows from the seed)."""
    return (generator.device.type == "cpu" and
            torch.equal(generator.get_state(), torch.Generator().manual_seed(generator.initial_seed()).get_state()))


def _own_generator_order(plan, generator, algorithm, world):
    """Where one process shuffles from a fresh seeded generator, PyTorch's exact order of it (``algorithm``)."""
    if world.size == 1 and generator is not None and _fresh(generator):
        plan.update(shuffle_algorithm=algorithm, seed=int(generator.initial_seed()))


def loader_plan(length, batch_size, shuffle, sampler, batch_sampler, drop_last, generator, world, persistent=False):
    """The plan section for DataLoader's order arguments, and where its seed comes from.

    Args:
        length: Samples in the dataset.
        world: stager's ``World``, to check a ``DistributedSampler`` against.
        persistent: The loader keeps its workers across epochs (DataLoader
            then draws from its generator at the first epoch only).

    Returns:
        An ``Order``.

    Raises:
        ValueError: For a ``DistributedSampler`` of another world.
        TypeError: For a ``batch_sampler`` or a sampler whose order stager
            cannot compute ahead (after ``dataloader_rules`` passed them).
    """
    if batch_sampler is not None:
        raise TypeError("StagedLoader computes each epoch's minibatches ahead of time from a seed (that is how it "
                        "stages them before they are needed), so it cannot take a batch_sampler, whose batches only "
                        "it knows; use batch_size, shuffle and drop_last, or DataLoader for a custom batch_sampler")
    plan = {"batch_size": batch_size or 1, "epochs": 0, "drop_last": bool(drop_last) and batch_size is not None,
            "shuffle_algorithm": "torch", "split": "strided", "remainder": "pad"}
    if sampler is None:
        plan["shuffle"] = bool(shuffle)
        if shuffle:
            _own_generator_order(plan, generator, "torch_loader_persistent" if persistent else "torch_loader", world)
        return Order(plan, "torch" if generator is None else "generator")
    if isinstance(sampler, DistributedSampler):
        _check_distributed(sampler, world, length)
        plan.update(shuffle=bool(sampler.shuffle), seed=int(sampler.seed),
                    remainder="drop" if sampler.drop_last else "pad")
        return Order(plan, "sampler", sampler)
    if type(sampler) is SequentialSampler:
        plan["shuffle"] = False
        return Order(plan, "torch")
    if type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == length:
        plan["shuffle"] = True
        if generator is None or generator is not sampler.generator:
            _own_generator_order(plan, sampler.generator, "torch_sampler", world)
        return Order(plan, "torch" if sampler.generator is None else "sampler_generator")
    raise TypeError(f"StagedLoader computes each epoch's order ahead of time from a seed, so it takes no sampler "
                    f"but SequentialSampler, RandomSampler (without replacement, over the whole dataset) and "
                    f"DistributedSampler; {type(sampler).__name__} draws an order only it knows. For a subset, "
                    f"wrap the dataset in torch.utils.data.Subset and use shuffle; for weighted or custom "
                    f"sampling, use DataLoader")


def draw_seed(order, generator, sampler):
    """This rank's seed for ``order.seed_from`` (before the ranks agree on rank 0's)."""
    if order.seed_from == "generator":
        return int(generator.initial_seed())
    if order.seed_from == "sampler_generator":
        return int(sampler.generator.initial_seed())
    # The default generator's seed: what torch.manual_seed(s) set, or the random one torch chose at start.
    return int(torch.initial_seed())


def process_settings(num_workers, prefetch_factor, timeout, multiprocessing_context):
    """The ``reader`` and ``processes`` values (and the stall limit) for DataLoader's process arguments.

    ``num_workers`` readers (0 keeps ``reader.workers``: stager always
    decodes in reader processes); ``prefetch_factor``, when given,
    minibatches decoded ahead per reader; ``timeout`` bounds each wait for
    a minibatch and each prefetcher's wait for one file;
    ``multiprocessing_context`` starts the readers and prefetchers. The
    values are those ``dataloader_rules`` accepted.
    """
    out = {}
    if num_workers:
        out["reader"] = {"workers": int(num_workers)}
    if prefetch_factor is not None:
        out.setdefault("reader", {})["ahead"] = max(1, prefetch_factor) * (num_workers or 1)
    if timeout:
        out["staging"] = {"stall_timeout_s": float(timeout)}
    if multiprocessing_context is not None:
        method = (multiprocessing_context if isinstance(multiprocessing_context, str)
                  else multiprocessing_context.get_start_method())
        out["processes"] = {"start_method": method}
    return out
