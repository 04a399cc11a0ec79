"""Train a torchvision ResNet-18 with PyTorch Lightning on an ImageFolder, through StagedLoader or DataLoader.

    .venv/bin/stager make-dataset /tmp/imgs --samples 512 --format jpeg --classes 4
    .venv/bin/python examples/train_lightning.py /tmp/imgs --epochs 2 --devices 2
    .venv/bin/mpiexec -n 2 .venv/bin/python examples/train_lightning.py /tmp/imgs --epochs 2 --devices 2
    .venv/bin/python examples/train_lightning.py /tmp/imgs --epochs 2 --loader dataloader

A ``LightningDataModule`` whose ``train_dataloader()`` returns the loader:
``StagedLoader`` and ``DataLoader`` take the same arguments, and the
``--loader`` choice changes one line, the one marked below. Lightning
passes a loader that is not a ``DataLoader`` through untouched (no sampler
injected): StagedLoader gives each rank its ``DistributedSampler`` share by
itself, seeded by ``L.seed_everything`` as Lightning's sampler is. Its
``state_dict`` goes into Lightning's checkpoints, so ``--resume`` of a
checkpoint taken mid-epoch continues the exact order. Staging settings come
from ``$STAGER_CONFIG`` (a YAML file) or ``$STAGER_LOCAL_DIR``, else
stager's defaults.
"""

import argparse

import lightning as L
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms as T

from iterators.pytorch import StagedLoader


class ImageFolderData(L.LightningDataModule):
    """An ImageFolder with torchvision's training transforms."""

    def __init__(self, root, batch_size, workers, image_size, loader):
        super().__init__()
        self.root, self.batch_size, self.workers, self.image_size, self.loader = (root, batch_size, workers,
                                                                                  image_size, loader)
        self.train = None

    def setup(self, stage):
        self.train = torchvision.datasets.ImageFolder(self.root, transform=T.Compose([
            T.RandomResizedCrop(self.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))

    def train_dataloader(self):
        loader_class = StagedLoader if self.loader == "stager" else DataLoader  # the one line that differs
        return loader_class(self.train, batch_size=self.batch_size, shuffle=True, num_workers=self.workers,
                            drop_last=True, persistent_workers=self.workers > 0)


class Classifier(L.LightningModule):
    def __init__(self, classes):
        super().__init__()
        self.model = torchvision.models.resnet18(num_classes=classes)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.model(images), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="an ImageFolder directory (one subdirectory per class)")
    parser.add_argument("--loader", choices=["stager", "dataloader"], default="stager")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, or stager's readers")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (strategy ddp from 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", metavar="CKPT", help="a Lightning checkpoint to continue from")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                        help="also save a checkpoint every STEPS steps (mid-epoch)")
    args = parser.parse_args()

    L.seed_everything(args.seed)
    data = ImageFolderData(args.data, args.batch_size, args.workers, args.image_size, args.loader)
    classes = len(torchvision.datasets.folder.find_classes(args.data)[0])
    callbacks = []
    if args.checkpoint_every:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=args.checkpoint_every,
                                                             save_top_k=-1))
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_epochs=args.epochs, logger=False, enable_checkpointing=bool(callbacks),
                        callbacks=callbacks, log_every_n_steps=1)
    trainer.fit(Classifier(classes), datamodule=data, ckpt_path=args.resume)
    if trainer.is_global_zero:
        print(f"trained {args.epochs} epoch(s) of {trainer.num_training_batches} steps on "
              f"{trainer.world_size} process(es) ({args.loader}); loss {float(trainer.callback_metrics['loss']):.3f}")


if __name__ == "__main__":
    main()
