"""The node's cache room: residency and pins, the policy registry, and a policy
that removes files, run end to end through a real pipeline."""

import os

import numpy as np
import pytest

from conftest import load_catalog, make_config
from stager import plan
from stager.cache import ABSENT, IN_FLIGHT, POLICIES, STAGED, Cache, make_policy
from stager.errors import ConfigError
from stager.pipeline import Pipeline


def test_a_request_pins_each_file_once_and_fetches_only_absent_ones():
    cache = Cache(np.array([10, 20, 30, 40]))
    missing, waiting = cache.request(np.array([2, 0, 2]))
    assert missing.tolist() == [0, 2] and waiting.tolist() == [0, 2]
    assert cache.state.tolist() == [IN_FLIGHT, ABSENT, IN_FLIGHT, ABSENT] and cache.in_flight_bytes == 40
    missing, waiting = cache.request(np.array([2, 3]))
    assert missing.tolist() == [3] and waiting.tolist() == [2, 3]
    assert cache.pins.tolist() == [1, 0, 2, 1]
    cache.staged(2)
    assert cache.state[2] == STAGED and (cache.staged_bytes, cache.in_flight_bytes) == (30, 50)
    missing, waiting = cache.request(np.array([2]))
    assert missing.tolist() == [] and waiting.tolist() == []
    assert cache.release(np.array([0, 2])) == []  # unbounded keeps everything
    assert cache.pins.tolist() == [0, 0, 2, 1]


def test_policies_are_chosen_by_name_and_unknown_ones_are_refused():
    assert make_policy("unbounded").name == "unbounded"
    with pytest.raises(ConfigError, match="unknown policy 'belady'.*unbounded"):
        make_policy("belady")
    with pytest.raises(ConfigError, match="staging.cache_policy must be one of"):
        make_config("/data", "/local", staging={"cache_policy": "belady"})


class DropWhenRead:
    """A policy that keeps nothing: every file goes once no minibatch needs it."""

    name = "drop-when-read"
    released_calls = []

    def released(self, cache, indices):
        assert (cache.pins[indices] == 0).all(), "the policy was offered a pinned file"
        assert set(cache.plans) == {0} and isinstance(cache.plans[0], plan.PlanSpec)
        DropWhenRead.released_calls.append(indices.tolist())
        return indices.tolist()

    def victims(self, cache, nbytes):
        return []


@pytest.fixture
def drop_policy():
    POLICIES[DropWhenRead.name] = DropWhenRead
    DropWhenRead.released_calls.clear()
    yield DropWhenRead
    del POLICIES[DropWhenRead.name]


def test_released_files_reach_the_policy_and_removed_ones_are_fetched_again(slow_source, dataset, tmp_path,
                                                                            drop_policy):
    # One minibatch in flight at a time, so each is read, released and its
    # files removed before the next is asked for: every epoch fetches again.
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 2}, dataset={"loader": "raw"},
                      staging={"lookahead": 1, "cache_policy": drop_policy.name},
                      reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(cfg)
    root, _ = dataset
    seen = []
    with Pipeline(cfg, catalog) as pipe:
        for batch in pipe:
            seen.append((batch.epoch, batch.step, batch.indices.tolist()))
            for i, (data, _) in zip(batch.indices, batch.samples):
                with open(os.path.join(root, catalog.path(i)), "rb") as fh:
                    assert data == fh.read()
        stats = pipe.stats
    assert seen == [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert stats.files_staged == 2 * len(catalog), "a removed file must be fetched again when needed"
    released = sorted(i for call in drop_policy.released_calls for i in call)
    assert released == sorted(list(range(len(catalog))) * 2), "every file is released once per epoch"


def test_the_unbounded_policy_fetches_each_file_once_over_epochs(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 3}, staging={"lookahead": 1},
                      reader={"workers": 1, "ahead": 1})
    with Pipeline(cfg) as pipe:
        batches = sum(1 for _ in pipe)
        assert pipe.stats.files_staged == len(pipe.catalog) and batches == 3 * -(-len(pipe.catalog) // 8)
