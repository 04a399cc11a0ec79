"""A training script in the style of the published references (torchvision's, pytorch/examples' ImageNet).

    [torchrun --nproc_per_node=2] published_train.py TRAIN VAL OUT LOCAL staged|dataloader

The patterns those scripts use, each with the real object: distributed when
launched so (``init_process_group`` from torchrun's variables), with
``DistributedSampler`` then and no sampler alone (``shuffle=(train_sampler
is None)``); a ``collate_fn`` applying ``torchvision.transforms.v2``'s
MixUp or CutMix; ``pin_memory``, ``drop_last``, ``persistent_workers``,
``worker_init_fn`` and a seeded ``generator``; a validation loader that
stays a ``DataLoader``. The last argument changes one line: the training
loader's class. Each rank writes ``OUT/<loader>-rank<r>.json``: per epoch
the dataset indices and labels of each training batch, the shape of the
mixed targets, and how many validation samples it evaluated.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler, default_collate
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from iterators.pytorch import StagedLoader

EPOCHS, BATCH, WORKERS, SEED, CLASSES = 2, 4, 2, 17, 3


class Indexed(ImageFolder):
    def __getitem__(self, index):
        image, target = super().__getitem__(index)
        return image, target, index


def seed_worker(worker_id):
    # The references seed numpy and random per worker from torch's seed; here the call is what matters.
    torch.manual_seed(torch.initial_seed() % 2 ** 32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("train")
    parser.add_argument("val")
    parser.add_argument("out")
    parser.add_argument("local")
    parser.add_argument("loader", choices=["staged", "dataloader"])
    args = parser.parse_args()

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    transform = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(8, scale=(0.5, 1.0), antialias=True),
                            v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    dataset = Indexed(args.train, transform=transform)
    dataset_test = ImageFolder(args.val, transform=v2.Compose([v2.PILToTensor(), v2.Resize(8), v2.CenterCrop(8),
                                                               v2.ToDtype(torch.float32, scale=True)]))
    train_sampler = DistributedSampler(dataset) if distributed else None
    test_sampler = (DistributedSampler(dataset_test, shuffle=False) if distributed
                    else SequentialSampler(dataset_test))
    mixup_cutmix = v2.RandomChoice([v2.MixUp(num_classes=CLASSES), v2.CutMix(num_classes=CLASSES)])

    def collate_fn(batch):
        images, targets, indices = default_collate(batch)
        mixed, soft = mixup_cutmix(images, targets)
        return mixed, soft, targets, indices

    loader_class = StagedLoader if args.loader == "staged" else DataLoader
    extra = {"config": {"staging": {"local_dir": args.local, "prefetchers": 2}}} if args.loader == "staged" else {}
    data_loader = loader_class(dataset, batch_size=BATCH, shuffle=(train_sampler is None), sampler=train_sampler,
                               num_workers=WORKERS, pin_memory=True, drop_last=True, persistent_workers=True,
                               worker_init_fn=seed_worker, generator=torch.Generator().manual_seed(SEED),
                               collate_fn=collate_fn, **extra)
    data_loader_test = DataLoader(dataset_test, batch_size=BATCH, sampler=test_sampler, num_workers=WORKERS,
                                  pin_memory=True)

    model = torch.nn.Linear(3 * 8 * 8, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    record = {"train": {}, "evaluated": {}, "len": len(data_loader)}
    for epoch in range(EPOCHS):
        if distributed:
            train_sampler.set_epoch(epoch)
        steps = []
        for images, soft, targets, indices in data_loader:
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), soft)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps.append({"indices": indices.tolist(), "labels": targets.tolist(), "soft": list(soft.shape)})
        record["train"][epoch] = steps
        with torch.no_grad():
            record["evaluated"][epoch] = sum(len(y) for _, y in data_loader_test)
    if hasattr(data_loader, "close"):
        data_loader.close()
    with open(os.path.join(args.out, f"{args.loader}-rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
