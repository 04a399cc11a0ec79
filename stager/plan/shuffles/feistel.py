"""A keyed bijection on [0, n), evaluated one position at a time.

A balanced Feistel network permutes the integers of ``2b`` bits (the
smallest even width with ``2**2b >= n``, so at most four times ``n``
values); cycle walking (applying it again while the value is ``>= n``)
restricts it to [0, n), which stays a bijection because every cycle of the
larger permutation that enters [0, n) comes back to it. The round keys come
from (seed, epoch), so any process computes any position, or the position of
any sample, without the rest of the epoch: cost linear in what is asked.

Eight rounds of a 64-bit mixing function (murmur3's finaliser of the right
half xor a round key): four already make a pseudo-random permutation in
theory (Luby-Rackoff); the extra rounds are for small ``n``, where each half
has only a few bits and a round mixes little.
"""

import numpy as np

MATERIALISES = False
ROUNDS = 8
_TAG = 0x5F3759DF  # separates these keys from any other use of SeedSequence([seed, epoch])
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S = np.uint64(33)


def _network(n, seed, epoch):
    """Half width in bits and round keys of epoch ``epoch``'s network."""
    bits = max(2, int(n - 1).bit_length() if n > 1 else 2)
    half = (bits + 1) // 2
    keys = np.random.SeedSequence([seed, epoch, _TAG]).generate_state(ROUNDS, np.uint64)
    return np.uint64(half), np.uint64((1 << half) - 1), keys


def _mix(right, key, mask):
    x = right ^ key
    x ^= x >> _S
    x *= _M1
    x ^= x >> _S
    x *= _M2
    x ^= x >> _S
    return x & mask


def _walk(values, n, step):
    """``step`` applied until every value is back in [0, n) (cycle walking)."""
    x = np.asarray(values, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= n):
        raise ValueError(f"values must lie in [0, {n}); got {x.min()}..{x.max()}")
    y = step(x.reshape(-1).astype(np.uint64))
    todo = np.flatnonzero(y >= n)
    while todo.size:
        y[todo] = step(y[todo])
        todo = todo[y[todo] >= n]
    return y.astype(np.int64).reshape(x.shape)


def forward(n, seed, epoch):
    """Positions to samples: the network, walked into [0, n)."""
    half, mask, keys = _network(n, seed, epoch)

    def step(x):
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ _mix(right, key, mask)
        return (left << half) | right

    return lambda positions: _walk(positions, n, step)


def inverse(n, seed, epoch):
    """Samples to positions: the rounds undone in reverse order, walked into [0, n)."""
    half, mask, keys = _network(n, seed, epoch)

    def step(x):
        left, right = x >> half, x & mask
        for key in keys[::-1]:
            left, right = right ^ _mix(left, key, mask), left
        return (left << half) | right

    return lambda indices: _walk(indices, n, step)
