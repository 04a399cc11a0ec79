"""The PyTorch front end with real torch: collated batches, resume, elastic resume."""

import gc
import itertools
import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import load_catalog, make_config
from exit_check import run_to_exit
from iterators.pytorch import StagedLoader
from stager import plan
from stager.world import World


@pytest.fixture
def cfg(slow_source, tmp_path):
    return make_config(slow_source, tmp_path / "local", plan={"batch_size": 8, "seed": 5})


def index_of(catalog):
    root = catalog.root
    lookup = {}
    for i in range(len(catalog)):
        lookup[np.load(os.path.join(root, catalog.path(i))).tobytes()] = i
    return lookup


def indices(batch, lookup):
    data, labels = batch
    return [lookup[x.numpy().tobytes()] for x in data]


def test_yields_collated_tensors_in_plan_order_epoch_after_epoch(cfg):
    catalog = load_catalog(cfg)
    lookup = index_of(catalog)
    with StagedLoader(cfg) as loader:
        assert len(loader) == 13
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = []
            for data, labels in loader:
                assert data.dtype == torch.uint8 and data.shape[1:] == (5, 256, 3)
                got.append([lookup[x.numpy().tobytes()] for x in data])
                assert labels.tolist() == [catalog.label(i) for i in got[-1]]
            expected = itertools.islice(plan.iterate(len(catalog), loader.config.plan, epoch), 13)
            assert got == [m.indices.tolist() for m in expected]
        staged = loader._pipe.stats.files_staged
    assert staged == len(catalog), "the second epoch must read the files staged in the first"


def test_state_dict_resumes_with_exactly_the_remaining_sequence(cfg):
    catalog = load_catalog(cfg)
    lookup = index_of(catalog)
    with StagedLoader(cfg) as loader:
        full = [indices(b, lookup) for epoch in range(2) for b in loader]
    with StagedLoader(cfg) as loader:
        first = [indices(b, lookup) for b in loader]
        it = iter(loader)
        first += [indices(next(it), lookup) for _ in range(4)]
        state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 4 * 8
    with StagedLoader(cfg) as loader:
        loader.load_state_dict(state)
        rest = [indices(b, lookup) for b in loader]
    assert first + rest == full


def test_works_as_the_dataset_of_a_dataloader_without_workers(cfg):
    catalog = load_catalog(cfg)
    lookup = index_of(catalog)
    with StagedLoader(cfg) as loader:
        direct = [indices(b, lookup) for b in loader]
    with StagedLoader(cfg) as loader:
        via = [indices(b, lookup) for b in DataLoader(loader, batch_size=None)]
    assert via == direct
    with StagedLoader(cfg) as loader:
        batches = iter(DataLoader(loader, batch_size=None, num_workers=1))
        with pytest.raises(RuntimeError, match="does its own loading"):
            next(batches)
        del batches  # ends the DataLoader's worker process
        gc.collect()


def test_a_state_from_another_dataset_is_refused_by_key(cfg):
    with StagedLoader(cfg) as loader:
        state = loader.state_dict()
    state["seed"] = 99
    with StagedLoader(cfg) as loader:
        with pytest.raises(ValueError, match=r"state_dict\['seed'\] is 99 but this loader has 5"):
            loader.load_state_dict(state)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_elastic_resume_from_4_ranks_to_2_repeats_and_skips_nothing(slow_source, tmp_path, remainder):
    # Ranks are simulated by their World (the plan is a pure function of it);
    # each runs its own real pipeline.
    cfg = make_config(slow_source, tmp_path / "local", plan={"batch_size": 3, "seed": 8, "remainder": remainder})
    catalog = load_catalog(cfg)
    lookup = index_of(catalog)

    def world(rank, size):
        return World(rank=rank, size=size, node=f"n{rank}", node_index=rank, nodes=size)

    steps, done, states = 5, [[] for _ in range(4)], []
    for rank in range(4):
        with StagedLoader(cfg, world=world(rank, 4)) as loader:
            it = iter(loader)
            done[rank] = [indices(next(it), lookup) for _ in range(steps)]
            states.append(loader.state_dict())
    assert len({(s["epoch"], s["position"]) for s in states}) == 1
    rest = [[], []]
    for rank in range(2):
        with StagedLoader(cfg, world=world(rank, 2)) as loader:
            loader.load_state_dict(states[0])
            rest[rank] = [indices(b, lookup) for b in loader]
    assert len(rest[0]) == len(rest[1])
    before = [i for s in range(steps) for r in range(4) for i in done[r][s]]
    after = [i for s in range(len(rest[0])) for r in range(2) for i in rest[r][s]]
    order = plan.permutation(len(catalog), 8, 0).tolist()
    assert before == order[:len(before)]
    if remainder == "pad":
        assert after[:len(order) - len(before)] == order[len(before):]
        assert sorted(set(before + after)) == list(range(len(catalog)))
    else:
        assert after == order[len(before):len(before) + len(after)]
        assert len(order) - len(before) - len(after) < 2


def test_an_error_is_raised_again_by_the_next_iteration_not_swallowed(cfg, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "helpers"))
    from stager.errors import StageError

    failing = cfg.replace(dataset={"loader": "faults:fail_on_class_2"})
    with StagedLoader(failing) as loader:
        for _ in range(2):
            with pytest.raises(StageError, match="unreadable sample"):
                for _ in loader:
                    pass


@pytest.mark.parametrize("key,value", [("position", -8), ("position", 8.5), ("epoch", -1), ("epoch", None)])
def test_a_malformed_position_is_refused_by_load_state_dict(cfg, key, value):
    with StagedLoader(cfg) as loader:
        state = dict(loader.state_dict(), **{key: value})
        with pytest.raises(ValueError, match=rf"state_dict\['{key}'\]: {key} is {value!r}"):
            loader.load_state_dict(state)
        with pytest.raises(ValueError, match="set_epoch"):
            loader.set_epoch(-1)


def test_a_loader_alive_at_interpreter_exit_ends_quietly(dataset, tmp_path):
    root, _ = dataset
    config = {"dataset": {"source": root, "manifest": "manifest.tsv"},
              "staging": {"local_dir": str(tmp_path / "local")}, "reader": {"workers": 2}}
    # Held by a reference cycle, the loader is collected only after the
    # interpreter has begun tearing its modules down.
    rc, out, err, left = run_to_exit(
        "import json\n"
        "from iterators.pytorch import StagedLoader\n"
        "loader = StagedLoader(json.loads(sys.argv[1]))\n"
        "loader.cycle = loader\n"
        "batches = iter(loader)\n"
        "next(batches)\n"
        "report_children()\n", json.dumps(config))
    assert rc == 0, err
    assert "CHILDREN" in out and not err.strip(), err
    assert not left, "workers outlived the interpreter"
