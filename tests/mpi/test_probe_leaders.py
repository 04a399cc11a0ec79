"""``auto``'s probe among node leaders with peers: a leader with no files of its own to probe takes another's
measurements, and one leader's failed probe fails every leader's start. Every rank of COMM_WORLD plays a leader,
so it passes at any size."""

import pytest

from stager.engine.perf import machine
from stager.engine.tuning.autocounts import _among_leaders
from stager.errors import StageError
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.fixture(scope="module")
def leaders():
    world = detect("on")
    comm = world.comm.Dup()  # collective
    yield comm
    comm.Free()


def measured(rank):
    """A probe's result that says which rank measured it and what it was given."""
    def probe(picks):
        return {"open_s": 0.001 * (rank + 1), "cores": 1000 + rank, "memory": 7, "picks": picks}
    return probe


def test_a_leader_without_files_takes_the_first_measurements_and_keeps_its_own_cores(leaders):
    rank = leaders.Get_rank()
    first = [rank, rank + 1] if rank == 0 else None  # only leader 0 reads any file first
    got = _among_leaders(leaders, measured(rank), first)
    assert got["open_s"] == 0.001 and got["picks"] == [0, 1]
    cores, memory = machine()
    assert (got["cores"], got["memory"]) == ((1000, 7) if rank == 0 else (cores, memory))


def test_leaders_with_files_keep_their_own_and_with_none_anywhere_each_probes_a_spread(leaders):
    rank = leaders.Get_rank()
    assert _among_leaders(leaders, measured(rank), [rank])["open_s"] == 0.001 * (rank + 1)
    alone = _among_leaders(leaders, measured(rank), None)
    assert (alone["open_s"], alone["picks"]) == (0.001 * (rank + 1), None)


def test_a_failed_probe_fails_every_leader_naming_the_leader(leaders):
    rank = leaders.Get_rank()

    def probe(picks):
        raise OSError(f"no such file: shard-{rank}.tar")

    first = [5] if rank == leaders.Get_size() - 1 else None  # the last leader probes, and fails
    if first:
        with pytest.raises(OSError, match=f"shard-{rank}.tar"):
            _among_leaders(leaders, probe, first)
    else:
        with pytest.raises(StageError, match=f"node leader {leaders.Get_size() - 1} could not probe the source "
                                             f"for auto counts: OSError: no such file: shard-"):
            _among_leaders(leaders, probe, first)
