"""One epoch over an ImageFolder behind the emulator, read by DataLoader or by StagedLoader on its defaults.

Run under ``strace -f -y`` by tests/test_source_calls.py:
``python tests/source_calls.py dataloader|staged DATA WORK``. It mounts
DATA through the emulator (0 ms an open) at WORK/mnt, so the trace holds
both sides of every file: the loader's calls on WORK/mnt/... and the
emulator daemon's on DATA/..., what reaches the file system's servers.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main():
    method, data, work = sys.argv[1:4]
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from stager.slowfs import SlowFS
    from torchvision import transforms as T  # after iterators.pytorch (torchvision beside a CPU-only torch)
    from torchvision.datasets import ImageFolder

    torch.manual_seed(0)
    os.mkdir(os.path.join(work, "mnt"))
    with SlowFS(data, os.path.join(work, "mnt"), open_ms=0, mbps=0) as mnt:
        train = ImageFolder(mnt, transform=T.Compose([T.RandomResizedCrop(64), T.ToTensor()]))
        if method == "dataloader":
            loader = DataLoader(train, batch_size=16, shuffle=True, num_workers=2)
        else:
            loader = StagedLoader(train, batch_size=16, shuffle=True, num_workers=2,
                                  config={"staging": {"local_dir": os.path.join(work, "local")}})
        samples = sum(len(labels) for _, labels in loader)
        if hasattr(loader, "close"):
            loader.close()
    assert samples == len(train), (samples, len(train))
    print(samples)


if __name__ == "__main__":
    main()
