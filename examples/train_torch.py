"""Train a small CNN with DistributedDataParallel, reading through stager.

    .venv/bin/torchrun --nproc_per_node=2 examples/train_torch.py configs/demo.yaml --epochs 2
    .venv/bin/mpiexec -n 2 .venv/bin/python examples/train_torch.py configs/demo.yaml --epochs 2
    .venv/bin/python examples/train_torch.py configs/demo.yaml --epochs 2

The config describes the dataset (configs/demo.yaml: a synthetic dataset
behind the emulated slow file system, created and mounted by rank 0) and the
staging. Each rank trains on its own share of every epoch; gradients are
averaged by DDP over gloo (CPU). Changing a training script to stager is the
``StagedLoader`` line. With ``--checkpoint FILE`` the model, the optimizer
and the loader's position are saved after every step, and a run that finds
the file resumes from it: ``torchrun --max-restarts=N`` restarts a failed
worker group, which then continues where the last step left off.
"""

import argparse
import contextlib
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from iterators.pytorch import StagedLoader
from stager import load_config
from stager.job import prepare_source
from stager.job.progress import RunProgress
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
    """The gloo process group DDP uses: torchrun's (stager already initialised it), or one agreed over MPI."""
    if world.size == 1:
        return False
    if dist.is_initialized():
        return True
    address = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = (socket.gethostname(), s.getsockname()[1])
    host, port = world.comm.bcast(address, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=world.rank, world_size=world.size)
    return True


def save_checkpoint(path, model, optimizer, loader):
    tmp = f"{path}.part"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": loader.state_dict()},
               tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="stager YAML config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", metavar="FILE", help="save after every step; resume from it if it exists")
    parser.add_argument("--report", metavar="FILE.json", help="write the stall report's input ('stager report')")
    args = parser.parse_args()

    # torchrun's agent stops the other workers with SIGTERM when one fails:
    # unwinding (rather than dying) stops stager's workers and unmounts.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    cfg = load_config(args.config, args.set)
    world = detect(cfg.world.mpi, cfg.world.backend)
    install_abort_hook(world)  # one rank's crash ends the job instead of hanging DDP
    torch.manual_seed(0)
    with contextlib.ExitStack() as stack:
        distributed = init_distributed(world)
        if distributed:  # last out: stager's own groups live in the default one under torchrun
            stack.callback(dist.destroy_process_group)
        cfg = prepare_source(cfg, stack, progress=world.rank == 0, world=world)
        model = SmallCNN(cfg.synthetic.classes)
        if distributed:
            model = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        loader = stack.enter_context(StagedLoader(cfg, world=world))  # the one line that changes
        first = 0
        if args.checkpoint and os.path.exists(args.checkpoint):
            saved = torch.load(args.checkpoint)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            loader.load_state_dict(saved["data"])
            first = saved["data"]["epoch"]
            if world.rank == 0:
                print(f"resumed from epoch {first}, sample {saved['data']['position']}", flush=True)
        for epoch in range(first, args.epochs):
            loader.set_epoch(epoch)
            begin, seen, total = time.perf_counter(), 0, 0.0
            # A live line on a terminal: samples/s, stall, bytes staged (quiet in a batch log).
            bar = RunProgress(len(loader), f"epoch {epoch}", lambda: loader.stats, enabled=world.rank == 0)
            for images, labels in loader:
                x = images.permute(0, 3, 1, 2).float().div_(255.0)  # NHWC uint8 -> NCHW float
                loss = nn.functional.cross_entropy(model(x), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                total += loss.item() * len(labels)
                if args.checkpoint and world.rank == 0:
                    save_checkpoint(args.checkpoint, model, optimizer, loader)
                bar.update()
            bar.close()
            wall = time.perf_counter() - begin
            stats = loader.stats
            if world.rank == 0:
                print(f"epoch {epoch}: loss {total / max(seen, 1):.4f}, {seen} samples on rank 0 in {wall:.2f} s, "
                      f"waited for data {stats.stall_s:.2f} s in total", flush=True)
        if args.report:
            loader.report(args.report)  # collective: every rank
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
