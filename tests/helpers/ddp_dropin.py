"""A DDP script as PyTorch users write it, with StagedLoader in DataLoader's place (run by torchrun).

    torchrun --nproc_per_node=2 ddp_dropin.py ROOT LOCAL OUT

Each rank reads two epochs through ``DistributedSampler(ds, seed=7)`` with
``set_epoch``, and writes, per epoch, the dataset indices of what it got
and the indices the same sampler gives DataLoader (without reading a file:
the test counts every open of the source), to ``OUT/rank-<r>.json``.
"""

import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from iterators.pytorch import StagedLoader  # first: it makes torchvision importable beside a CPU-only torch
from torchvision import transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402


class Indexed(ImageFolder):
    """An ImageFolder whose samples say which they are (a subclass overriding ``__getitem__``)."""

    def __getitem__(self, index):
        image, target = super().__getitem__(index)
        return image, target, index


def main():
    root, local, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = Indexed(root, transform=T.Compose([T.Resize(12), T.CenterCrop(12), T.PILToTensor()]))
    sampler = DistributedSampler(ds, shuffle=True, seed=7)
    loader = StagedLoader(ds, batch_size=3, sampler=sampler, num_workers=2,
                          config={"staging": {"local_dir": local, "prefetchers": 2}})
    got, want = {}, {}
    with loader:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            got[epoch] = [index.tolist() for _, _, index in loader]
            want[epoch] = [batch.tolist() for batch in DataLoader(list(sampler), batch_size=3)]
        files = loader.stats.files_staged if loader.stats is not None else None
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as fh:
        json.dump({"got": got, "want": want, "samples": len(ds), "files_staged": files}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
