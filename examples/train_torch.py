"""Train a small CNN with DistributedDataParallel, reading through stager.

    .venv/bin/mpiexec -n 2 .venv/bin/python examples/train_torch.py configs/demo.yaml --epochs 2

The config describes the dataset (configs/demo.yaml: a synthetic dataset
behind the emulated slow file system, created and mounted by rank 0) and the
staging. Each rank trains on its own share of every epoch; gradients are
averaged by DDP over gloo (CPU). Changing a training script to stager is the
``StagedLoader`` line.
"""

import argparse
import contextlib
import socket
import time

import torch
import torch.distributed as dist
from torch import nn

from iterators.pytorch import StagedLoader
from stager import load_config
from stager.job import prepare_source
from stager.world import detect, install_abort_hook


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.features(x))


def init_distributed(world):
    """Starts a gloo process group at rank 0's address, agreed over MPI."""
    if world.size == 1:
        return False
    address = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = (socket.gethostname(), s.getsockname()[1])
    host, port = world.comm.bcast(address, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=world.rank, world_size=world.size)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="stager YAML config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    cfg = load_config(args.config, args.set)
    world = detect(cfg.world.mpi)
    install_abort_hook(world)  # one rank's crash ends the job instead of hanging DDP
    torch.manual_seed(0)
    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress=world.rank == 0, world=world)
        distributed = init_distributed(world)
        if distributed:
            stack.callback(dist.destroy_process_group)
        model = SmallCNN(cfg.synthetic.classes)
        if distributed:
            model = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        loader = stack.enter_context(StagedLoader(cfg, world=world))  # the one line that changes
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            begin, seen, total = time.perf_counter(), 0, 0.0
            for images, labels in loader:
                x = images.permute(0, 3, 1, 2).float().div_(255.0)  # NHWC uint8 -> NCHW float
                loss = nn.functional.cross_entropy(model(x), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                total += loss.item() * len(labels)
            wall = time.perf_counter() - begin
            stats = loader.stats
            if world.rank == 0:
                print(f"epoch {epoch}: loss {total / max(seen, 1):.4f}, {seen} samples on rank 0 in {wall:.2f} s, "
                      f"waited for data {stats.stall_s:.2f} s in total", flush=True)
        if distributed:
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            low, high = flat.clone(), flat.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if world.rank == 0:
                state = "in sync" if torch.equal(low, high) else "DIVERGED"
                print(f"{world.size} replicas {state} after {args.epochs} epoch(s)", flush=True)


if __name__ == "__main__":
    main()
