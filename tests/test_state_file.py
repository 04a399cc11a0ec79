"""``stager run``'s state file on its own: files of an older stager, and runs that cannot agree."""

import json

import pytest

from stager import plan
from stager.config import PlanConfig
from stager.errors import StagerError
from stager.job.state import END, StateFile
from stager.world import World

CFG = PlanConfig(batch_size=4, epochs=2, seed=9)


def legacy(path, rank, epoch, consumed, size):
    state = plan.resume_state(plan.Position(epoch, consumed), 100, CFG, size)
    (path.parent / f"{path.name}.rank{rank}").write_text(json.dumps(state))


def test_per_rank_files_of_an_older_stager_resume_from_their_smallest_and_are_replaced(tmp_path):
    path = tmp_path / "state.json"
    for rank, consumed in enumerate((48, 32, 56)):
        legacy(path, rank, 1, consumed, 3)
    state = StateFile(str(path), World(), 100, CFG)
    assert state.load() == plan.Position(1, 32), "a position every rank reached"
    agreed, _ = state.agree(plan.Position(1, 40), END)
    assert agreed == plan.Position(1, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"], "one file replaces them"
    assert json.loads(path.read_text())["position"] == 40


def test_per_rank_files_with_a_rank_missing_are_refused_by_name(tmp_path):
    path = tmp_path / "state.json"
    legacy(path, 0, 0, 16, 3)
    legacy(path, 2, 0, 24, 3)
    with pytest.raises(StagerError, match=r"state.json.rank0, state.json.rank2\) but not those of rank\(s\) 1, "
                                          r"whose positions are unknown"):
        StateFile(str(path), World(), 100, CFG).load()


def test_ranks_without_a_communicator_cannot_agree_and_are_refused(tmp_path):
    with pytest.raises(StagerError, match=r"needs the 2 ranks to agree on one position, but this run has no "
                                          r"communicator \(env:PMI_RANK\)"):
        StateFile(str(tmp_path / "state.json"), World(rank=1, size=2, source="env:PMI_RANK"), 100, CFG)


def test_the_end_of_the_plan_removes_the_state(tmp_path):
    path = tmp_path / "state.json"
    state = StateFile(str(path), World(), 100, CFG, epochs=2)
    state.agree(plan.Position(1, 0), 0)  # a periodic agreement saves
    assert json.loads(path.read_text())["epoch"] == 1
    assert state.agree(plan.Position(2, 0), END) == (plan.Position(2, 0), END)
    assert not path.exists()
