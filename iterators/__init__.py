"""Framework front ends for stager's pipeline (Chainer, PyTorch)."""
