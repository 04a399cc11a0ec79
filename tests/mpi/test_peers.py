"""The peer transfer protocol inside every rank, each rank on a communicator
of its own (it is both the holder and the requester), so it passes at any size."""

import os
import pathlib
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest

from stager import telemetry as tm
from stager.engine.messages import Given, PeerFetch, Staged
from stager.engine.peers import FirstReaders, Peers
from stager.engine.peers.fetcher import PeerFetcher
from stager.engine.peers.protocol import CHUNK, Ask
from stager.engine.peers.server import PeerServer
from stager.sources import open_source
from stager.telemetry import Telemetry
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.fixture(scope="module")
def comm():
    world = detect("on")
    own = world.comm.Split(world.rank, 0)  # collective: every rank makes its own
    yield own
    own.Free()


@pytest.fixture
def dirs():
    # Not tmp_path: pytest's numbered directories race between the ranks of one job.
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="stager-peers-"))
    source, holder, requester = (tmp_path / n for n in ("source", "holder", "requester"))
    for d in (source, holder, requester):
        d.mkdir()
    rng = np.random.default_rng(0)
    files = {"small.bin": 3000, "large.bin": 2 * CHUNK + 123}
    for name, size in files.items():
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        (source / name).write_bytes(data)
        (holder / name).write_bytes(data)
    yield source, holder, requester, files
    shutil.rmtree(tmp_path)


def transfer(comm, dirs, names, to_come=lambda index, seq: False, position=lambda: -1, still_s=10.0,
             moved=lambda index: -1, on_offers=lambda peer, ask, handed: None, offers=(), on_served=lambda index, seq: None):
    source, holder, requester, files = dirs
    telemetry = Telemetry()
    server = PeerServer(comm, str(holder), telemetry, 30, to_come, on_served, position=position, moved=moved,
                        on_offers=on_offers)
    fetcher = PeerFetcher(comm, open_source(str(source)), str(requester), 2, 30, still_s=still_s)
    server.start()
    fetcher.start()
    try:
        fetcher.tasks.put(PeerFetch(7, 1, 0, 0, [(i, name, files[name], None) for i, name in enumerate(names)],
                                    offers=offers))
        replies = []
        while sum(len(m.done) for m in replies if isinstance(m, Staged)) < len(names):
            replies.append(fetcher.conn.recv())
    finally:
        fetcher.stop(5)
        server.stop(5)
    served = [(e[2], e[3]) for e in telemetry.events([tm.SERVED])]
    return replies, served


def test_a_holder_sends_its_copy_byte_for_byte_in_bounded_chunks(comm, dirs):
    source, _, requester, files = dirs
    replies, served = transfer(comm, dirs, ["small.bin", "large.bin"])
    assert [(m.task, m.route, m.done) for m in replies] == [(7, "peer", [(0, files["small.bin"]),
                                                                         (1, files["large.bin"])])], replies
    for name in files:
        assert (requester / name).read_bytes() == (source / name).read_bytes()
    assert sorted(served) == [(0, files["small.bin"]), (1, files["large.bin"])]
    assert [p for p in os.listdir(requester) if p.startswith(".")] == []


def test_a_holder_that_evicted_the_file_makes_the_requester_read_the_source(comm, dirs):
    source, holder, requester, files = dirs
    os.unlink(holder / "small.bin")                      # evicted after the requester chose to ask
    with open(holder / "large.bin", "r+b") as fh:        # a copy of another size is no copy
        fh.truncate(CHUNK)
    replies, served = transfer(comm, dirs, ["small.bin", "large.bin"])
    assert [(m.route, m.done) for m in replies] == [("source", [(0, files["small.bin"]),
                                                                (1, files["large.bin"])])], replies
    for name in files:
        assert (requester / name).read_bytes() == (source / name).read_bytes()
    assert sorted(served) == [(0, 0), (1, 0)], "the holder answered, sending nothing"
    assert [p for p in os.listdir(requester) if p.startswith(".")] == [], "nothing partial is left"


def test_a_copy_published_while_the_holder_answers_is_sent_not_read_again_from_the_source(comm, dirs):
    """The holder's fetch finishes between its look for the file and its cache's answer, which then says
    the file is not to come (it is staged): the copy is there, so it is sent."""
    source, holder, requester, files = dirs
    os.unlink(holder / "small.bin")  # still being fetched when the ask comes

    def published_meanwhile(index, seq):
        tmp = holder / ".small.bin.part"
        shutil.copyfile(source / "small.bin", tmp)
        os.rename(tmp, holder / "small.bin")
        return False

    replies, served = transfer(comm, dirs, ["small.bin"], to_come=published_meanwhile)
    assert [(m.route, m.done) for m in replies] == [("peer", [(0, files["small.bin"])])], replies
    assert (requester / "small.bin").read_bytes() == (source / "small.bin").read_bytes()
    assert served == [(0, files["small.bin"])]


def test_files_dropped_for_room_ride_with_the_request_to_the_holder_after_its_answer(comm, dirs):
    """A node short of room gives the holder it asks the file it dropped (``swaps``): the bytes travel in
    the request, and the holder is handed them once it has answered (the room its answer frees), with the
    files it sent in exchange: those count as handed on only as the service keeps the gift (until then
    the holder's own fetches would take their room: at 4 nodes of 256 files a node, most gifts found none)."""
    source, _, requester, files = dirs
    offer = (9, "given.bin", 5, None, b"bytes")
    got = []
    replies, served = transfer(comm, dirs, ["small.bin", "large.bin"], offers=(offer,),
                               on_served=lambda index, seq: got.append(("served", index)),
                               on_offers=lambda peer, ask, handed: got.append(("offers", peer, ask.offers,
                                                                                handed)))
    assert got == [("offers", 0, (offer,), (0, 1))], "offered once, after the files asked for were sent"
    assert [(m.route, m.done) for m in replies] == [("peer", [(0, files["small.bin"]), (1, files["large.bin"])])]
    # Without an offer, each file sent is handed on as it goes.
    got.clear()
    (requester / "small.bin").unlink()
    transfer(comm, dirs, ["small.bin"], on_served=lambda index, seq: got.append(("served", index)),
             on_offers=lambda peer, ask, handed: got.append(("offers",)))
    assert got == [("served", 0)]


def test_files_given_wait_for_the_service_and_never_block_the_server(comm, dirs):
    """What other nodes give stays in the leader's memory: the server thread only wakes the service with
    a message of a few bytes, at most one on its way, so it never blocks on a pipe the service has stopped
    reading (megabytes given at the end of a job did, and the job hung); once closing, gifts are dropped."""
    source, _, requester, _ = dirs
    peers = Peers(comm, FirstReaders(np.zeros(4, dtype=np.int32), 0), open_source(str(source)), str(requester), 1,
                  Telemetry())
    peers.start()
    offer = (3, "given.bin", CHUNK, None, bytes(CHUNK))
    for _ in range(100):  # 100 MiB given, nobody reading
        peers._offered(0, Ask([], 1, 0, offers=(offer,)), ())
    assert peers.conn.poll(5) and isinstance(peers.conn.recv(), Given)
    assert not peers.conn.poll(0.1), "one wake-up for all of them"
    taken = peers.take_given()
    assert len(taken) == 100 and all(a.giver == 0 and a.files == (offer,) for a in taken)
    peers._offered(0, Ask([], 1, 0, offers=(offer,)), ())
    assert peers.conn.poll(5) and isinstance(peers.conn.recv(), Given), "taken: the next gift wakes it again"
    peers.close(0, 5)
    peers._offered(0, Ask([], 1, 0, offers=(offer,)), ())  # the server answers to the end; the service is gone
    assert len(peers.take_given()) == 1
    with pytest.raises(OSError):
        peers.fetcher.send(Given())


def test_a_holder_that_gave_the_file_away_names_the_node_it_went_to(comm, dirs):
    """The holder answers ``MOVED`` with the node; the requester asks that one, unless it is itself (this
    communicator has one rank): then it reads the source, whole."""
    source, holder, requester, files = dirs
    os.unlink(holder / "small.bin")
    asked = []
    replies, served = transfer(comm, dirs, ["small.bin"], moved=lambda index: asked.append(index) or 0)
    assert asked == [0]
    assert [(m.route, m.done) for m in replies] == [("source", [(0, files["small.bin"])])], replies
    assert (requester / "small.bin").read_bytes() == (source / "small.bin").read_bytes()
    assert served == [(0, 0)]


def test_a_node_fetching_a_file_it_gave_away_asks_the_node_it_went_to(comm, dirs):
    """Node 0 read file 0 after node 1, dropped it for room and gave it to node 3. Reading it again at step
    6 it asks node 3, in the order the node's service fetches (``Cache.fetching``, then ``route``), not the
    node that read it before it (that order once forgot where the file went: at 4 nodes of 256 files a
    node, 41 of 88 re-reads of the source were files kept by the node they were given to); after that
    it answers for the file itself."""
    from stager.cache import Cache
    from stager.engine.peers import LatestReaders

    source, _, requester, _ = dirs
    steps, nodes, files = (np.array(c, dtype=np.int64) for c in zip((0, 1, 0), (2, 0, 0), (6, 0, 0), (3, 2, 1)))
    rule = LatestReaders(steps, nodes, files, me=0, count=2)
    peers = Peers(comm, rule, open_source(str(source)), str(requester), 1, Telemetry())
    peers.start()
    try:
        cache = Cache(np.ones(2, dtype=np.int64), "clairvoyant", capacity=2)
        peers.keep_in(cache)
        rule.advance(2)
        asked = peers.route(np.array([0]), np.ones(1), 2)[0]
        assert [(o, i.tolist()) for o, i in asked] == [(1, [0])]  # node 1 read it before
        rule.gave(0, 3)
        rule.advance(6)
        cache.fetching(np.array([0]), 6)
        groups, from_source = peers.route(np.array([0]), np.ones(1), 6)
        assert [(o, i.tolist()) for o, i in groups] == [(3, [0])] and not len(from_source)
        assert rule.moved[0] == -1
        assert [(o, i.tolist()) for o, i in peers.route(np.array([0]), np.ones(1), 6)[0]] == [(1, [0])]
    finally:
        peers.close(0, 5)


def test_a_holder_whose_ranks_do_not_move_is_read_around(comm, dirs):
    """The holder says the file is to come, from a position that never moves: once ``still_s`` has
    passed, the requester reads it from the source and counts it as a fallback (not waiting out the
    30 s a holder may take)."""
    source, holder, requester, files = dirs
    os.unlink(holder / "small.bin")
    asked = []
    replies, served = transfer(comm, dirs, ["small.bin"], to_come=lambda index, seq: asked.append(index) or True,
                               position=lambda: 5, still_s=0.3)
    assert [(m.route, m.done) for m in replies] == [("fallback", [(0, files["small.bin"])])], replies
    assert len(asked) >= 2, "it asked again before giving up"
    assert (requester / "small.bin").read_bytes() == (source / "small.bin").read_bytes()


def test_a_holder_that_moves_is_waited_for_past_still_s(comm, dirs):
    """The holder's position moves at every answer and the file comes after three times ``still_s``:
    the requester keeps asking and takes it from the holder, not from the source."""
    source, holder, requester, files = dirs
    data = (holder / "small.bin").read_bytes()
    os.unlink(holder / "small.bin")
    first, moves = [], iter(range(10**6))

    def to_come(index, seq):
        first.append(time.monotonic())
        if first[-1] - first[0] > 0.9:  # it stages the file; the next ask finds it
            (holder / "small.bin").write_bytes(data)
        return True

    replies, served = transfer(comm, dirs, ["small.bin"], to_come=to_come, position=lambda: next(moves),
                               still_s=0.3)
    assert [(m.route, m.done) for m in replies] == [("peer", [(0, files["small.bin"])])], replies
    assert len(first) > 2 and first[-1] - first[0] > 0.9
    assert (requester / "small.bin").read_bytes() == (source / "small.bin").read_bytes()


def fetch_two(comm, dirs, to_come, second_after, timeout_s=10):
    """One fetch thread: task 7 (step 3, ``small.bin``), then, once ``second_after`` is set, task 8 (``large.bin``)
    at the step given by ``second_after.step``. Returns the replies and the holder's answers in order."""
    source, holder, requester, files = dirs
    telemetry = Telemetry()
    server = PeerServer(comm, str(holder), telemetry, 30, to_come, position=iter(range(10**6)).__next__)
    fetcher = PeerFetcher(comm, open_source(str(source)), str(requester), 1, timeout_s, still_s=timeout_s)
    server.start()
    fetcher.start()
    try:
        fetcher.tasks.put(PeerFetch(7, 1, 0, 0, [(0, "small.bin", files["small.bin"], None)], 3))
        assert second_after.wait(timeout_s), "the holder was never asked for the first task's file"
        fetcher.tasks.put(PeerFetch(8, 1, 0, 0, [(1, "large.bin", files["large.bin"], None)], second_after.step))
        second_after.queued = True
        replies = []
        while sum(len(m.done) for m in replies if isinstance(m, Staged)) < 2:
            replies.append(fetcher.conn.recv())
    finally:
        fetcher.stop(5)
        server.stop(5)
    for name in files:
        assert (requester / name).read_bytes() == (source / name).read_bytes()
    return replies, [(e[2], e[3]) for e in telemetry.events([tm.SERVED])]


def test_a_thread_waiting_on_a_file_to_come_takes_an_earlier_steps_task_meanwhile(comm, dirs):
    """One fetch thread waits on the file of step 3, which its holder stages only once the requester has
    the file of step 2 (the holder's ranks wait on what the requester's ranks fetch): the thread hands
    step 3 back, fetches step 2, then step 3, both from the holder. A thread that kept waiting would
    fetch nothing until the holder was given up on (the source read: route ``fallback``)."""
    source, holder, requester, files = dirs
    data = (holder / "small.bin").read_bytes()
    os.unlink(holder / "small.bin")
    asked = threading.Event()
    asked.step = 2

    def to_come(index, seq):
        asked.set()
        if (requester / "large.bin").exists():
            (holder / "small.bin").write_bytes(data)  # staged now: the next ask finds it
        return True

    replies, served = fetch_two(comm, dirs, to_come, asked)
    assert [(m.task, m.route, m.done) for m in replies] == [
        (8, "peer", [(1, files["large.bin"])]), (7, "peer", [(0, files["small.bin"])])], replies


def test_a_later_steps_task_does_not_overtake_a_file_to_come(comm, dirs):
    """The thread waits on the file of step 3 (staged by its holder two asks after a task of step 4 was
    queued): the holder is asked for step 4's file only once it has sent step 3's, which it
    keeps for that step (a later task fetched first is how shared containers came to be read twice)."""
    source, holder, requester, files = dirs
    data = (holder / "small.bin").read_bytes()
    os.unlink(holder / "small.bin")
    asked = threading.Event()
    asked.step, asked.queued, calls = 4, False, []

    def to_come(index, seq):
        asked.set()
        if asked.queued:
            calls.append(seq)
            if len(calls) == 2:
                (holder / "small.bin").write_bytes(data)
        return True

    replies, served = fetch_two(comm, dirs, to_come, asked)
    assert [(m.task, m.route) for m in replies] == [(7, "peer"), (8, "peer")], replies
    assert calls == [3, 3], calls
    assert [s for s in served if s[1] > 0] == [(0, files["small.bin"]), (1, files["large.bin"])], served
