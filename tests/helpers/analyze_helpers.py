"""A decoder of known cost and training steps for ``stager analyze``'s tests (``analyze_helpers:NAME``)."""

import time

import numpy as np

DECODE_S = 0.025


def slow_npy(path):
    """Decodes ``.npy`` after ``DECODE_S`` seconds: a decoder whose cost is known."""
    time.sleep(DECODE_S)
    return np.load(path)


def torch_step(batch):
    """A step over ``default_collate``'s ``(images, labels)`` tensors; refuses anything else."""
    import torch

    images, labels = batch
    if not (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)):
        raise TypeError(f"expected two tensors, got {type(images).__name__}, {type(labels).__name__}")
    if images.dtype != torch.uint8 or images.dim() != 4 or labels.shape != images.shape[:1]:
        raise TypeError(f"unexpected batch: images {images.dtype} {tuple(images.shape)}, labels "
                        f"{tuple(labels.shape)}")
    (images.float().mean(dim=(1, 2, 3)) * labels.float()).sum().item()


def announcing_step(batch):
    """A step that says on standard error that it ran: tells a test that minibatches flow."""
    import sys

    print("analyze_helpers: step", file=sys.stderr, flush=True)
