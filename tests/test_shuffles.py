"""The shuffle registry: the old order kept, the per-position bijection and its statistical quality."""

import numpy as np
import pytest

from stager import plan
from stager.config import PlanConfig
from stager.errors import ConfigError
from stager.plan import shuffles


def test_pcg64_is_the_order_of_earlier_runs():
    for seed, epoch in [(0, 0), (7, 3), (123, 41)]:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
        assert np.array_equal(plan.permutation(1000, seed, epoch), rng.permutation(1000))
    assert PlanConfig().shuffle_algorithm == "pcg64" == shuffles.DEFAULT


@pytest.mark.parametrize("name", sorted(shuffles.SHUFFLES))
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 100_003])
def test_every_shuffle_is_a_bijection_and_its_inverse_undoes_it(name, n):
    if name == "shards":  # bound to containers of 1 to 40 samples, as a sharded catalog binds it
        name = shuffles.ShardShuffle.of(np.repeat(np.arange(n), np.random.default_rng(n).integers(1, 41, n))[:n], 4)
    for seed, epoch in [(0, 0), (5, 1), (2**40, 9)]:
        perm = shuffles.at(n, seed, epoch, np.arange(n), name)
        assert np.array_equal(np.sort(perm), np.arange(n))
        assert np.array_equal(shuffles.position_of(n, seed, epoch, perm, name), np.arange(n))
        picked = np.array([0, n - 1, n // 2])
        assert np.array_equal(shuffles.at(n, seed, epoch, picked, name), perm[picked])  # one position at a time


def test_feistel_depends_on_seed_and_epoch_and_refuses_positions_outside_the_epoch():
    base = shuffles.at(1000, 7, 3, np.arange(1000), "feistel")
    assert not np.array_equal(base, shuffles.at(1000, 7, 4, np.arange(1000), "feistel"))
    assert not np.array_equal(base, shuffles.at(1000, 8, 3, np.arange(1000), "feistel"))
    assert int(shuffles.at(10**9, 1, 2, 123_456_789, "feistel")) == shuffles.at(10**9, 1, 2, [123_456_789], "feistel")[0]
    with pytest.raises(ValueError, match=r"\[0, 1000\)"):
        shuffles.at(1000, 7, 3, [1000], "feistel")


def _quality(name, n, seeds):
    """Chi-square of sample-at-position counts, of consecutive pairs, and the worst pair correlations."""
    perms = np.stack([shuffles.at(n, s, 3, np.arange(n), name) for s in range(seeds)])
    counts = np.stack([np.bincount(perms[:, p], minlength=n) for p in range(n)])
    expected = seeds / n
    chi_positions = ((counts - expected) ** 2 / expected).sum()
    pairs = np.zeros((n, n))
    np.add.at(pairs, (perms[:, :-1].ravel(), perms[:, 1:].ravel()), 1)
    off = ~np.eye(n, dtype=bool)
    chi_pairs = ((pairs - seeds / n) ** 2 / (seeds / n))[off].sum()
    # Two samples' positions (and two positions' samples) correlate by -1/(n-1) in a uniform permutation.
    positions = np.argsort(perms, axis=1)
    worst = max(np.abs(np.corrcoef(m.T)[off] + 1 / (n - 1)).max() for m in (positions, perms))
    return chi_positions, chi_pairs, worst


@pytest.mark.parametrize("n", [6, 50])
def test_feistel_is_as_uniform_as_pcg64_over_many_seeds(n):
    seeds = 2000
    chi, chi_pairs, worst = _quality("feistel", n, seeds)
    _, _, reference = _quality("pcg64", n, seeds)
    dof, dof_pairs = (n - 1) ** 2, n * (n - 1) - n
    assert chi < dof + 5 * np.sqrt(2 * dof)                 # each sample lands at each position equally often
    assert chi_pairs < dof_pairs + 5 * np.sqrt(2 * dof_pairs)  # and follows each other sample equally often
    assert worst < 1.5 * reference + 0.01                  # no pair of samples or positions is tied


def test_the_shuffle_algorithm_is_checked_and_part_of_the_resume_key():
    with pytest.raises(ConfigError, match="plan.shuffle_algorithm must be one of"):
        PlanConfig(shuffle_algorithm="fisher")
    feistel = PlanConfig(shuffle_algorithm="feistel")
    state = plan.resume_state(plan.Position(1, 64), 1000, feistel, 4)
    assert plan.resume_position(state, 1000, feistel) == plan.Position(1, 64)
    with pytest.raises(plan.ResumeMismatch, match="shuffle_algorithm"):
        plan.resume_position(state, 1000, PlanConfig())
    old = {k: v for k, v in plan.resume_state(plan.Position(0, 8), 1000, PlanConfig(), 1).items()
           if k != "shuffle_algorithm"}  # saved before the key existed: read with pcg64
    assert plan.resume_position(old, 1000, PlanConfig()) == plan.Position(0, 8)
    with pytest.raises(plan.ResumeMismatch):
        plan.resume_position(old, 1000, feistel)
