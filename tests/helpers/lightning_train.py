"""A LightningModule as Lightning users write it; ``train_dataloader()`` returns StagedLoader or DataLoader.

    python lightning_train.py ROOT OUT TAG --loader staged|dataloader [--local DIR]
                              [--stop-after STEPS] [--resume CKPT] [--devices N]

Trains a linear model on an ImageFolder of JPEGs for two epochs under
``Trainer(accelerator="cpu", devices=N, strategy="ddp")``: Lightning starts
the other ranks by running this script again, or, under ``mpiexec -n N``,
finds them through its MPI environment. Each rank appends one JSON line
per training step to ``OUT/TAG-rank<r>.jsonl`` (epoch, batch index, the
dataset indices and labels of the batch), flushed, so a killed run leaves
what it trained on. ``--stop-after`` saves a checkpoint (Lightning's own
``trainer.save_checkpoint``) after that many steps, then every rank kills
the whole process group at the next step's start, as a scheduler's SIGKILL
would; ``--resume`` passes the checkpoint to ``trainer.fit(ckpt_path=)``.
"""

import argparse
import json
import os
import signal

import lightning as L
import torch
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from iterators.pytorch import StagedLoader

SEED, BATCH, EPOCHS = 5, 4, 2


class Indexed(ImageFolder):
    """An ImageFolder whose samples say which they are."""

    def __getitem__(self, index):
        image, target = super().__getitem__(index)
        return image, target, index


class Model(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.linear = torch.nn.Linear(3 * 8 * 8, 3)
        self.record = None

    def train_dataloader(self):
        ds = Indexed(self.args.root, transform=T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()]))
        if self.args.loader == "dataloader":
            return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=1)
        return StagedLoader(ds, batch_size=BATCH, shuffle=True, num_workers=1,
                            config={"staging": {"local_dir": self.args.local, "prefetchers": 2}})

    def training_step(self, batch, batch_idx):
        images, labels, indices = batch
        if self.record is None:
            path = os.path.join(self.args.out, f"{self.args.tag}-rank{self.global_rank}.jsonl")
            self.record = open(path, "a")
        self.record.write(json.dumps({"epoch": self.current_epoch, "batch": batch_idx,
                                      "indices": indices.tolist(), "labels": labels.tolist(),
                                      "len": self.trainer.num_training_batches}) + "\n")
        self.record.flush()
        return torch.nn.functional.cross_entropy(self.linear(images.flatten(1)), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillAfter(L.Callback):
    """A checkpoint after ``steps`` steps, then SIGKILL for every process of the job at the next step."""

    def __init__(self, steps, path):
        self.steps, self.path, self.done = steps, path, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.done += 1
        if self.done == self.steps:
            trainer.save_checkpoint(self.path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.done == self.steps:
            trainer.strategy.barrier()  # the checkpoint is whole on every rank
            os.killpg(os.getpgrp(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("tag")
    parser.add_argument("--loader", choices=["staged", "dataloader"], required=True)
    parser.add_argument("--local")
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--resume")
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    L.seed_everything(SEED)
    callbacks = [KillAfter(args.stop_after, os.path.join(args.out, "mid.ckpt"))] if args.stop_after else []
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=callbacks)
    trainer.fit(Model(args), ckpt_path=args.resume)


if __name__ == "__main__":
    main()
