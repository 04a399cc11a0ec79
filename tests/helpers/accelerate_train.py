"""A training script in Hugging Face Accelerate's style, with StagedLoader in DataLoader's place.

    accelerate launch --cpu --num_processes 2 accelerate_train.py ROOT OUT TAG --local DIR
                      [--loader staged|dataloader] [--stop-after STEPS] [--resume DIR]

``accelerator.prepare(model, optimizer, loader)`` as Accelerate's examples
do; the loader is registered for checkpointing, so ``save_state`` and
``load_state`` carry its position (StagedLoader resumes itself: no
``skip_first_batches``). The epoch to start from follows from the saved
step count and ``len(loader)``, as in Accelerate's checkpointing example.
Each rank appends a JSON line per step to ``OUT/TAG-rank<r>.jsonl``
(flushed); ``--stop-after`` saves the state after that many steps, then
every rank kills the job's process group, as a scheduler's SIGKILL would.
"""

import argparse
import json
import os
import signal
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from iterators.pytorch import StagedLoader

SEED, BATCH, EPOCHS = 5, 4, 2


class Indexed(ImageFolder):
    def __getitem__(self, index):
        image, target = super().__getitem__(index)
        return image, target, index


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("tag")
    parser.add_argument("--local")
    parser.add_argument("--loader", choices=["staged", "dataloader"], default="staged")
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--resume")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(SEED)
    ds = Indexed(args.root, transform=T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()]))
    if args.loader == "dataloader":
        # No worker processes: Python 3.11.7's fork can deadlock the child (CPython gh-112275) when a thread
        # of the parent (gloo's, freeing a Python object) holds the interpreter's thread list, and DataLoader
        # forks its workers anew each epoch. Workers do not change Accelerate's sharding, which is compared.
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0)
    else:
        loader = StagedLoader(ds, batch_size=BATCH, shuffle=True, num_workers=1,
                              config={"staging": {"local_dir": args.local, "prefetchers": 2}})
    model = torch.nn.Linear(3 * 8 * 8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(loader)

    step, starting_epoch = 0, 0
    if args.resume:
        accelerator.load_state(args.resume)
        with open(os.path.join(args.resume, "step")) as fh:
            step = int(fh.read())
        starting_epoch = step // len(loader)

    record = open(os.path.join(args.out, f"{args.tag}-rank{accelerator.process_index}.jsonl"), "a")
    for epoch in range(starting_epoch, EPOCHS):
        for images, labels, indices in loader:
            if args.stop_after is not None and step == args.stop_after:
                accelerator.wait_for_everyone()  # the state is whole on every rank
                os.killpg(os.getpgrp(), signal.SIGKILL)
            record.write(json.dumps({"epoch": epoch, "indices": indices.tolist(), "labels": labels.tolist(),
                                     "len": len(loader), "type": type(loader).__name__}) + "\n")
            record.flush()
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.stop_after:
                state = os.path.join(args.out, "state")
                accelerator.save_state(state)
                if accelerator.is_main_process:
                    with open(os.path.join(state, "step"), "w") as fh:
                        fh.write(str(step))
    accelerator.wait_for_everyone()
    if hasattr(loader, "close"):
        loader.close()
    accelerator.end_training()
    record.close()
    # Not the interpreter's teardown: freeing the DDP model there joins gloo's threads while holding the GIL,
    # and one of them may still need it to free the last barrier's work (a deadlock in torch).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
