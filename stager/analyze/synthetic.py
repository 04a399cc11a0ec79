"""Synthetic minibatches: the same structure, shapes and types as real ones, made in memory.

DS-Analyzer measures pure compute by feeding the step data that costs
nothing to produce. Here a real minibatch is the template: every array (or
tensor, or bytes object) is replaced by fresh random content of the same
shape and type, drawn within the range of the real values (labels stay
valid class numbers, pixels stay pixels); everything else (Python labels,
strings) is kept as it is.
"""

import numpy as np


def _random_array(value, rng):
    if value.size == 0 or value.dtype.kind not in "biuf":
        return value.copy()  # nothing drawn for empty, complex, string or object arrays
    low, high = value.min(), value.max()
    if value.dtype.kind == "b":
        return rng.random(value.shape) < 0.5
    if value.dtype.kind in "iu":
        return rng.integers(int(low), int(high), size=value.shape, dtype=value.dtype, endpoint=True)
    out = rng.random(value.shape, dtype=np.float64) * (float(high) - float(low)) + float(low)
    return out.astype(value.dtype)


def _is_tensor(value):
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def synthetic_like(value, rng):
    """A copy of ``value`` whose arrays hold random numbers of the same shape, type and range.

    Args:
        value: A minibatch as the step receives it: nested lists, tuples and
            dictionaries of numpy arrays, torch tensors, bytes and scalars.
        rng: A ``numpy.random.Generator``.

    Returns:
        A new object of the same structure sharing no array memory with ``value``.
    """
    if isinstance(value, np.ndarray):
        return _random_array(value, rng)
    if _is_tensor(value):
        import torch  # only reached when the batch already holds tensors

        array = _random_array(value.detach().cpu().numpy(), rng)
        return torch.from_numpy(np.ascontiguousarray(array)).to(value.device)
    if isinstance(value, (bytes, bytearray)):
        return type(value)(rng.bytes(len(value)))
    if isinstance(value, dict):
        return {k: synthetic_like(v, rng) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(synthetic_like(v, rng) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(synthetic_like(v, rng) for v in value)
    return value
