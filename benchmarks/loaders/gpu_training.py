"""A ResNet-50 trained on one GPU from JPEGs behind the emulated slow file system: DataLoader against the one-line StagedLoader.

    python3 benchmarks/loaders/gpu_training.py --json /tmp/gpu-training.json     # on a machine with a GPU

An ImageFolder of 256x256 JPEGs (``torch_dropin.emulated_jpeg_folder``) is
mounted through the FUSE emulator at ``--open-ms`` an open and trained on
for ``--epochs`` epochs: torchvision's ResNet-50 (10 classes), SGD,
bfloat16 autocast, channels-last, batch ``--batch``, the usual training
transforms. Two ways, each in a fresh process, alternating over
``--rounds``: ``DataLoader(num_workers=N, pin_memory=True,
persistent_workers=True)``, and the one-line change, ``StagedLoader`` with
the same arguments and nothing else set. A few steps on random tensors warm
the GPU up before the clock starts. Per epoch: the wall time, the time the
loop waited in ``next()`` (the stall), the GPU's time in steps (each
synchronised), and images per second; the GPU's step alone sets the bound.

With the ``dali`` extra, two more ways (``--methods dali-file,dali-stager``):
a DALI pipeline with ``--workers`` threads that decodes on the GPU
(``fn.decoders.image_random_crop(device="mixed")``, or ``--dali-device
cpu``), resizes to 224x224 and normalises with a random mirror, read by
DALI's ``fn.readers.file`` or by the one line changed, ``iterators.dali.reader``
(docs/dali.md), and handed to the same loop by ``DALIGenericIterator``.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from torch_dropin import emulated_jpeg_folder, transforms  # noqa: E402


def one(args):
    """One way of loading in this process: per epoch wall, stall and GPU seconds, as JSON on stdout."""
    import torch
    import torchvision
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from torchvision.datasets import ImageFolder  # noqa: E402  (after iterators.pytorch)

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = torchvision.models.resnet50(num_classes=10).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images, labels):
        images = images.to(device, non_blocking=True).to(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync()

    for _ in range(5):  # cuDNN's choice of kernels and the allocator, before any clock runs
        step(torch.randn(args.batch, 3, 224, 224), torch.randint(0, 10, (args.batch,)))
    train = ImageFolder(args.data, transform=transforms())
    common = dict(batch_size=args.batch, shuffle=True, num_workers=args.n, pin_memory=not args.no_pin)
    if args.one.startswith("dali"):
        loader = dali_loader(args, device)
    elif args.one == "dataloader":
        loader = DataLoader(train, persistent_workers=True, **common)
    else:  # the one-line change: DataLoader's arguments, stager's defaults
        loader = StagedLoader(train, config={"staging": {"local_dir": args.local}}, **common)
    epochs = []
    for _ in range(args.epochs):
        begin, waited, gpu, samples = time.perf_counter(), 0.0, 0.0, 0
        batches = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            got = time.perf_counter()
            waited += got - asked
            step(images, labels)
            gpu += time.perf_counter() - got
            samples += len(labels)
        wall = time.perf_counter() - begin
        assert samples == len(train), (samples, len(train))
        epochs.append({"wall_s": wall, "stall_s": waited, "gpu_s": gpu, "images_per_s": samples / wall})
    if args.one == "dali-stager":
        from iterators.dali import readers

        for source in readers(loader.pipe):
            source.close()
    elif hasattr(loader, "close"):
        if args.report:
            loader.report(args.report)
        loader.close()
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(json.dumps({"epochs": epochs, "device": name, "torch": torch.__version__}))


def dali_loader(args, device):
    """DALI's pipeline over ``fn.readers.file`` (``dali-file``) or ``iterators.dali.reader`` (``dali-stager``):
    an iterable of ``(images, labels)`` each epoch, its ``pipe`` the DALI pipeline."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from dali_side import training_pipeline

    pipe = training_pipeline(args.one == "dali-file", args.data, args.local, args.batch, args.n, args.dali_device)
    # DALI's reader names its epoch's size; an external source ends its epochs itself (StopIteration).
    named = {"reader_name": "Reader"} if args.one == "dali-file" else {}
    batches = DALIGenericIterator(pipe, ["images", "labels"], last_batch_policy=LastBatchPolicy.PARTIAL,
                                  auto_reset=True, **named)

    class Epochs:
        def __iter__(self):
            for [batch] in batches:
                yield batch["images"].to(device), batch["labels"].reshape(-1).long().to(device)

    epochs = Epochs()
    epochs.pipe = pipe
    return epochs


def run(method, args, mnt, local):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--data", mnt, "--local", local,
           "--n", str(args.workers), "--epochs", str(args.epochs), "--batch", str(args.batch), "--device", args.device,
           "--dali-device", args.dali_device]
    cmd += ["--no-pin"] if args.no_pin else []
    if args.report_dir and method != "dataloader":
        cmd += ["--report", os.path.join(args.report_dir, f"{method}-b{args.batch}{'-nopin' if args.no_pin else ''}.json")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode:
        sys.exit(f"{method} failed:\n{proc.stdout}{proc.stderr}")
    for line in proc.stderr.splitlines():
        if line.startswith("stager:"):  # what stager chose at start, as the user sees it
            print(f"  {method}: {line}", file=sys.stderr)
    return json.loads(proc.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--open-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="num_workers of both loaders")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script without a GPU")
    parser.add_argument("--methods", default="dataloader,stagedloader",
                        help="of dataloader, stagedloader, dali-file, dali-stager (the last two: the dali extra)")
    parser.add_argument("--dali-device", default="mixed", help="where DALI decodes: mixed (the GPU's nvJPEG) or cpu")
    parser.add_argument("--no-pin", action="store_true", help="pin_memory=False in both loaders")
    parser.add_argument("--report-dir", help="write StagedLoader's report (loader.report) here")
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args)
    results = {"options": vars(args), "runs": []}
    with emulated_jpeg_folder(args.samples, args.open_ms, "stager-gpu-") as (work, mnt, _, decode_s):
        results["decode_s_per_sample"] = decode_s
        for r in range(args.rounds):
            for method in args.methods.split(","):
                local = os.path.join(work, f"local-{method}-{r}")
                os.mkdir(local)
                out = run(method, args, mnt, local)
                out.update(method=method, round=r)
                results["runs"].append(out)
                print(json.dumps(out), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    print(table(results))


def table(results):
    lines = ["| loader | epoch | wall s | stall s | GPU s | images/s |", "|---|---|---:|---:|---:|---:|"]
    for run_ in results["runs"]:
        for e, ep in enumerate(run_["epochs"], 1):
            lines.append(f"| {run_['method']} (round {run_['round'] + 1}) | {e} | {ep['wall_s']:.2f} | "
                         f"{ep['stall_s']:.2f} | {ep['gpu_s']:.2f} | {ep['images_per_s']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
