"""A keyed bijection on [0, n), evaluated one position at a time.

A Feistel network permutes the integers of ``b`` bits, the smallest width
with ``2**b >= n`` (so fewer than ``2n`` values); cycle walking (applying it
again while the value is ``>= n``) restricts it to [0, n), which stays a
bijection because every cycle of the larger permutation that enters [0, n)
comes back to it. When ``b`` is odd the halves differ by one bit and trade
widths each round (an even number of rounds brings them back), which keeps
the walk short: under two applications per position on average, where a
balanced network's ``2**2b`` values could need four. The round keys come
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
MIN_BITS = 6  # below, a half of one or two bits mixes too little: positions are visibly uneven
_TAG = 0x5F3759DF  # separates these keys from any other use of SeedSequence([seed, epoch])
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S = np.uint64(33)


def _network(n, seed, epoch):
    """Widths of the two halves (as shift and masks) and round keys of epoch ``epoch``'s network."""
    bits = max(MIN_BITS, int(n - 1).bit_length())
    wide, narrow = (bits + 1) // 2, bits // 2
    keys = np.random.SeedSequence([seed, epoch, _TAG]).generate_state(ROUNDS, np.uint64)
    masks = [np.uint64((1 << (wide if i % 2 == 0 else narrow)) - 1) for i in range(ROUNDS)]
    return np.uint64(narrow), np.uint64((1 << narrow) - 1), keys, masks


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
    shift, low, keys, masks = _network(n, seed, epoch)

    def step(x):
        left, right = x >> shift, x & low
        for key, mask in zip(keys, masks):
            left, right = right, left ^ _mix(right, key, mask)
        return (left << shift) | right

    return lambda positions: _walk(positions, n, step)


def inverse(n, seed, epoch):
    """Samples to positions: the rounds undone in reverse order, walked into [0, n)."""
    shift, low, keys, masks = _network(n, seed, epoch)

    def step(x):
        left, right = x >> shift, x & low
        for key, mask in zip(keys[::-1], masks[::-1]):
            left, right = right ^ _mix(left, key, mask), left
        return (left << shift) | right

    return lambda indices: _walk(indices, n, step)
