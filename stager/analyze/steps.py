"""What ``stager analyze`` runs per minibatch: the training step and the collate before it."""

import importlib
import time

from ..errors import ConfigError

COLLATES = ("none", "torch")


class SimulatedStep:
    """``stager run``'s stand-in for a training step: sleeps ``run.compute_ms``.

    Args:
        compute_ms: Milliseconds per step; 0 makes the step free.
    """

    def __init__(self, compute_ms):
        self.seconds = compute_ms / 1000.0
        self.name = f"simulated ({compute_ms:g} ms per step)"

    def __call__(self, batch):
        if self.seconds:
            time.sleep(self.seconds)


def load_step(spec):
    """Returns the callable that ``spec`` (``module:function``) names.

    Raises:
        ConfigError: Naming ``spec``, when it is not ``module:function``, the
            module cannot be imported, or it has no such callable.
    """
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"--step {spec!r} is not of the form module:function (a function taking one batch)")
    try:
        mod = importlib.import_module(module)
    except (ImportError, SyntaxError) as exc:
        raise ConfigError(f"--step {spec!r}: cannot import module {module!r}: {type(exc).__name__}: {exc}") \
            from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise ConfigError(f"--step {spec!r}: module {module!r} ({getattr(mod, '__file__', '?')}) has no "
                          f"function {name!r}")
    if not callable(fn):
        raise ConfigError(f"--step {spec!r}: {name!r} in module {module!r} is a {type(fn).__name__}, not a function")
    return fn


def make_collate(name):
    """Returns ``(samples) -> batch``: what the step receives from a list of ``(sample, label)`` pairs.

    Args:
        name: ``none`` (the list itself, as ``Pipeline`` delivers it in
            ``Batch.samples``) or ``torch`` (``default_collate``, as
            ``StagedLoader`` delivers it).
    """
    if name == "none":
        return lambda samples: samples
    if name == "torch":
        try:
            from torch.utils.data import default_collate
        except ImportError as exc:
            raise ConfigError(f"--collate torch needs PyTorch: {exc}") from None
        return default_collate
    raise ConfigError(f"--collate must be one of {', '.join(COLLATES)}, not {name!r}")
