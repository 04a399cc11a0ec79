"""Train a torchvision ResNet-18 on an ImageFolder with DDP, reading through DataLoader or stager.

    .venv/bin/stager make-dataset /tmp/imgs --samples 512 --format jpeg --classes 4
    .venv/bin/torchrun --nproc_per_node=2 examples/train_torch.py /tmp/imgs --epochs 2
    .venv/bin/torchrun --nproc_per_node=2 examples/train_torch.py /tmp/imgs --epochs 2 --loader dataloader
    .venv/bin/mpiexec -n 2 .venv/bin/python examples/train_torch.py /tmp/imgs --epochs 2
    .venv/bin/python examples/train_torch.py /tmp/imgs --epochs 2

A standard PyTorch training script: ``ImageFolder`` with torchvision's
training transforms, a ``DistributedSampler`` under DDP, SGD. ``--loader``
picks ``DataLoader`` or stager's ``StagedLoader``; the two differ in one line,
the one marked below. Staging settings (node-local directory, capacity,
prefetchers) come from ``--config FILE.yaml`` and ``--set KEY=VALUE``, or
stager's defaults. With ``--checkpoint FILE`` the model, the optimizer and
the loader's position are saved after every step, and a run that finds the
file resumes from it: ``torchrun --max-restarts=N`` restarts a failed worker
group, which then continues where the last step left off.
"""

import argparse
import contextlib
import importlib
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import torchvision
from torchvision import transforms as T

from iterators.pytorch import StagedLoader
from stager import config_from_dict, load_config
from stager.config import parse_overrides
from stager.world import detect, install_abort_hook


def init_distributed():
    """The default process group DDP uses: torchrun's variables, or one agreed over MPI under mpiexec or srun."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun (or a launcher that sets its variables)
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    world = detect()
    if world.size == 1:
        return 0, 1
    install_abort_hook(world)  # one rank's crash ends the MPI job instead of hanging DDP
    address = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = (socket.gethostname(), s.getsockname()[1])
    host, port = world.comm.bcast(address, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=world.rank, world_size=world.size)
    return world.rank, world.size


def staging_config(args):
    """stager's settings from ``--config`` and ``--set`` (None: stager's defaults, or ``$STAGER_CONFIG``)."""
    if args.config:
        return load_config(args.config, args.set)
    return config_from_dict(parse_overrides(args.set)) if args.set else None


def image_loader(spec):
    """``module:function`` reading one image file (default: torchvision's PIL loader)."""
    if not spec:
        return torchvision.datasets.folder.default_loader
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def save_checkpoint(path, model, optimizer, loader, epoch):
    tmp = f"{path}.part"
    data = loader.state_dict() if hasattr(loader, "state_dict") else {"epoch": epoch, "position": 0}
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": data}, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="an ImageFolder tree: DATA/<class>/<image>")
    parser.add_argument("--loader", choices=["stager", "dataloader"], default="stager")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, or stager's readers")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-loader", metavar="MODULE:FUNCTION", help="reads one image file (default: PIL)")
    parser.add_argument("--config", metavar="FILE.yaml", help="stager's staging settings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a stager setting")
    parser.add_argument("--checkpoint", metavar="FILE", help="save after every step; resume from it if it exists")
    parser.add_argument("--report", metavar="FILE.json", help="write stager's stall report ('stager report')")
    args = parser.parse_args()

    # torchrun's agent stops the other workers with SIGTERM when one fails:
    # unwinding (rather than dying) stops stager's workers and removes its files.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    torch.manual_seed(args.seed)
    rank, size = init_distributed()
    normalize = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    train = torchvision.datasets.ImageFolder(args.data, loader=image_loader(args.image_loader), transform=T.Compose(
        [T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(), T.ToTensor(), normalize]))
    sampler = DistributedSampler(train, seed=args.seed) if size > 1 else None
    model = torchvision.models.resnet18(num_classes=len(train.classes))
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    with contextlib.ExitStack() as stack:
        if size > 1:  # last out: stager's own groups live beside the default one
            stack.callback(dist.destroy_process_group)
        if args.loader == "stager":
            loader = stack.enter_context(StagedLoader(  # the one line that differs from DataLoader
                train, batch_size=args.batch_size, shuffle=None if sampler else True, sampler=sampler,
                num_workers=args.workers, drop_last=True, config=staging_config(args)))
        else:
            # Workers end with each epoch's iterator: persistent ones would still live when MPI finalizes
            # at exit, which then hangs now and then under mpiexec.
            loader = DataLoader(train, batch_size=args.batch_size, shuffle=None if sampler else True,
                                sampler=sampler, num_workers=args.workers, drop_last=True)
        first = 0
        if args.checkpoint and os.path.exists(args.checkpoint):
            saved = torch.load(args.checkpoint)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            if hasattr(loader, "load_state_dict"):
                loader.load_state_dict(saved["data"])
            first = saved["data"]["epoch"]
            if rank == 0:
                print(f"resumed from epoch {first}, sample {saved['data']['position']}", flush=True)
        for epoch in range(first, args.epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            elif hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            begin, seen, total, waited = time.perf_counter(), 0, 0.0, 0.0
            asked = time.perf_counter()
            for images, labels in loader:
                waited += time.perf_counter() - asked
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                total += loss.item() * len(labels)
                if args.checkpoint and rank == 0:
                    save_checkpoint(args.checkpoint, model, optimizer, loader, epoch)
                asked = time.perf_counter()
            if rank == 0:
                print(f"epoch {epoch}: loss {total / max(seen, 1):.4f}, {seen} samples on rank 0 in "
                      f"{time.perf_counter() - begin:.2f} s, waited for data {waited:.2f} s ({args.loader})",
                      flush=True)
        if args.report and args.loader == "stager":
            loader.report(args.report)  # collective: every rank
        if size > 1:
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            low, high = flat.clone(), flat.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if rank == 0:
                state = "in sync" if torch.equal(low, high) else "DIVERGED"
                print(f"{size} replicas {state} after {args.epochs} epoch(s)", flush=True)
            # gloo's worker thread frees a finished all_reduce's tensors under the GIL; were the group
            # torn down (DDP's reducer freed) while it does, the two would wait for each other. A last
            # collective without tensors lets it finish first.
            dist.barrier()
            del model


if __name__ == "__main__":
    main()
