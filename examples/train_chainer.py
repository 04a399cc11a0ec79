"""Train a small classifier with a Chainer Trainer, reading through stager.

    .venv/bin/stager make-dataset --config configs/demo.yaml       # the demo's dataset, once
    .venv/bin/python examples/train_chainer.py configs/demo.yaml --epochs 2

``StagingIterator`` replaces ``chainer.iterators.MultiprocessIterator``: the
same arguments and protocol, while stager stages each upcoming minibatch from
the (emulated) slow file system to local storage. Under mpiexec each rank's
iterator reads its own share (no ``scatter_dataset`` needed).
"""

import argparse
import contextlib

import numpy as np

from iterators.chainer import StagingIterator, _chainer as chainer
from stager import load_config
from stager.job import prepare_source
from stager.job.progress import RunProgress
from stager.world import detect, install_abort_hook


def converter(batch, device=None):
    """Stacks uint8 HWC images, keeps every 8th pixel, and scales to [0, 1]."""
    x, t = chainer.dataset.concat_examples(batch, device)
    return x[:, ::8, ::8, :].reshape(len(x), -1).astype(np.float32) / 255.0, t.astype(np.int32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="stager YAML config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="result", help="directory for the trainer's log and snapshots")
    parser.add_argument("--report", metavar="FILE.json", help="write the stall report's input ('stager report')")
    args = parser.parse_args()

    cfg = load_config(args.config, args.set)
    world = detect(cfg.world.mpi, cfg.world.backend)
    install_abort_hook(world)
    with contextlib.ExitStack() as stack:
        cfg = prepare_source(cfg, stack, progress=world.rank == 0, world=world)
        model = chainer.links.Classifier(chainer.links.Linear(None, cfg.synthetic.classes))
        optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
        optimizer.setup(model)
        # was: chainer.iterators.MultiprocessIterator(dataset, args.batch_size)
        train_iter = stack.enter_context(StagingIterator(cfg, args.batch_size, world=world))
        updater = chainer.training.updaters.StandardUpdater(train_iter, optimizer, converter=converter)
        trainer = chainer.training.Trainer(updater, (args.epochs, "epoch"), out=args.out)
        if world.rank == 0:
            trainer.extend(chainer.training.extensions.LogReport(trigger=(1, "epoch")))
            trainer.extend(chainer.training.extensions.PrintReport(
                ["epoch", "iteration", "main/loss", "main/accuracy", "elapsed_time"]))
            # A live line on a terminal: samples/s, stall, bytes staged (quiet in a batch log).
            bar = RunProgress(0, "training", lambda: train_iter.stats)
            trainer.extend(lambda _: bar.update(), trigger=(1, "iteration"), name="stager_progress")
            stack.callback(bar.close)
        trainer.run()
        if args.report:
            train_iter.report(args.report)  # collective: every rank


if __name__ == "__main__":
    main()
