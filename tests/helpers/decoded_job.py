"""One job of a ``staging.share`` group for ``tests/test_share_decoded.py``.

``python decoded_job.py ROOT LOCAL GROUP OUT LOADER [HOLD]``: an ImageFolder
at ROOT read through ``StagedLoader`` for three epochs in order, with the
group's staging directory under LOCAL. Each epoch appends one line to OUT:
the JSON list of ``[sha256 of the sample's tensor, label]``; the report goes
to ``OUT.report.json``. LOADER is ``default`` (torchvision's) or ``gray``
(a loader of its own, declared pure). With HOLD (a FIFO), the job waits
after its first epoch until the test opens it for writing.
"""

import hashlib
import json
import os
import sys

import torch

from iterators.pytorch import StagedLoader  # first: it makes torchvision importable beside a CPU-only torch
from torchvision import transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

EPOCHS = 3
FIXED = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])


def gray(path):
    from PIL import Image

    with open(path, "rb") as fh:
        return Image.open(fh).convert("L")


def digests(batches):
    """``[sha256 of each sample's tensor, its label]`` in order."""
    return [[hashlib.sha256(x.numpy().tobytes()).hexdigest(), int(y)] for xs, ys in batches for x, y in zip(xs, ys)]


def main(root, local, group, out, loader, hold=None):
    own = loader == "gray"
    dataset = ImageFolder(root, transform=FIXED, **({"loader": gray} if own else {}))
    config = {"staging": {"local_dir": local, "prefetchers": 2, "decoded": "on", "share": group},
              "processes": {"shutdown_timeout_s": 10.0}}
    with StagedLoader(dataset, batch_size=5, shuffle=False, num_workers=2, pure_loader=own, config=config) as dl:
        for epoch in range(EPOCHS):
            line = json.dumps(digests(dl))
            with open(out, "a") as fh:
                fh.write(line + "\n")
            if epoch == 0 and hold:
                os.close(os.open(hold, os.O_RDONLY))  # blocks until the test holds the FIFO open for writing
        report = dl.report()
    with open(out + ".report.json", "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:])
