"""``shuffle_algorithm: torch`` with ``split: strided`` is exactly what DistributedSampler and DataLoader give each rank."""

import numpy as np
import pytest
from torch.utils.data import DataLoader, DistributedSampler

from stager import plan
from stager.config import PlanConfig


def sampler_batches(n, size, rank, batch, shuffle, seed, epoch, sampler_drop_last, loader_drop_last):
    """The reference: PyTorch's own DistributedSampler and DataLoader over the indices 0..n-1."""
    dataset = list(range(n))
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=sampler_drop_last)
    sampler.set_epoch(epoch)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=loader_drop_last,
                        collate_fn=lambda b: list(b))
    return list(loader)


@pytest.mark.parametrize("n,size,batch", [(100, 1, 8), (103, 4, 4), (103, 3, 5), (10, 4, 3), (9, 16, 2),
                                          (1000, 7, 13)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("sampler_drop_last,loader_drop_last", [(False, False), (True, False), (False, True),
                                                                (True, True)])
def test_every_rank_reads_what_distributed_sampler_gives_it(n, size, batch, shuffle, sampler_drop_last,
                                                            loader_drop_last):
    cfg = PlanConfig(batch_size=batch, epochs=3, seed=17, shuffle=shuffle, drop_last=loader_drop_last,
                     remainder="drop" if sampler_drop_last else "pad", shuffle_algorithm="torch", split="strided")
    for epoch in (0, 2):
        for rank in range(size):
            want = sampler_batches(n, size, rank, batch, shuffle, 17, epoch, sampler_drop_last, loader_drop_last)
            if not want:  # DistributedSampler leaves this rank nothing: stager refuses such a plan up front
                with pytest.raises(ValueError):
                    plan.PlanSpec.from_config(n, cfg, size)
                continue
            got = [m for m in plan.iterate(n, cfg, epoch, 0, rank, size) if m.epoch == epoch]
            assert [m.indices.tolist() for m in got] == want, (epoch, rank)


def test_the_strided_split_resumes_mid_epoch_on_another_number_of_ranks():
    # A position is global: what 4 ranks left of epoch 1 after 3 steps, 2 ranks read in the same order.
    n, batch = 203, 4
    cfg = PlanConfig(batch_size=batch, epochs=2, seed=3, shuffle_algorithm="torch", split="strided")
    before = [m for r in range(4) for m in plan.iterate(n, cfg, 1, 0, r, 4) if m.step < 3]
    consumed = 3 * batch * 4
    after = [m for r in range(2) for m in plan.iterate(n, cfg, 1, consumed, r, 2) if m.epoch == 1]
    read = np.concatenate([m.indices for m in before + after])
    perm = plan.permutation(n, 3, 1, algorithm="torch")
    assert sorted(read.tolist()) == sorted(np.resize(perm, 204).tolist())  # the epoch once, padded to 2 ranks
