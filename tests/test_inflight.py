"""A prefetcher's fetch threads work on several stage tasks at once (``stager.engine.workers.inflight``)."""

import multiprocessing
import os
import threading

import numpy as np
from conftest import load_catalog, make_config

from stager import Pipeline, plan
from stager.engine.workers.inflight import InFlight
from stager.engine.messages import Failure, StageTask, Staged

WAIT_S = 10.0  # a bound on a broken run, never reached by a passing one


class Source:
    """Names items for messages; the fetch functions below stand in for its GETs."""

    def describe(self, rel):
        return f"s3://bucket/{rel}"


def tasks_of_one_file(n):
    return [StageTask(t, 0, t, [(t, f"f{t}.bin", 10, None)]) for t in range(n)]


def run_in_flight(tasks, threads, fetch):
    here, there = multiprocessing.Pipe()
    InFlight("p0", there, threading.Event(), Source(), "/nowhere", threads, fetch).run(iter(tasks))
    replies = []
    while len(replies) < len(tasks) and here.poll(WAIT_S):
        replies.append(here.recv())
        if isinstance(replies[-1], Failure):
            break
    return replies


def test_files_of_several_tasks_are_fetched_at_once():
    # Each fetch waits until four fetches run together: four one-file tasks
    # taken one at a time would break the barrier instead.
    together = threading.Barrier(4, timeout=WAIT_S)

    def fetch(source, dst_root, index, rel, size, mtime_ns):
        together.wait()
        return index, size

    replies = run_in_flight(tasks_of_one_file(8), 4, fetch)
    assert all(isinstance(r, Staged) for r in replies), replies
    assert sorted(r.task for r in replies) == list(range(8))
    assert all(r.done == [(r.task, 10)] and r.worker == "p0" for r in replies)


def test_a_new_task_is_taken_only_while_a_thread_is_free():
    # Tasks left in the shared queue can go to another prefetcher: one with
    # every thread busy must not take them.
    lock, counts, outstanding = threading.Lock(), {"taken": 0, "finished": 0}, []
    both_running = threading.Barrier(2, timeout=WAIT_S)

    def tasks():
        for task in tasks_of_one_file(12):
            with lock:
                outstanding.append(counts["taken"] - counts["finished"])
                counts["taken"] += 1
            yield task

    def fetch(source, dst_root, index, rel, size, mtime_ns):
        if index < 2:
            both_running.wait()  # the first two run together, so the third is asked for only after one ends
        with lock:
            counts["finished"] += 1
        return index, size

    here, there = multiprocessing.Pipe()
    InFlight("p0", there, threading.Event(), Source(), "/nowhere", 2, fetch).run(tasks())
    replies = [here.recv() for _ in range(12) if here.poll(WAIT_S)]
    assert sorted(r.task for r in replies) == list(range(12))
    assert max(outstanding) == 1, outstanding  # taken when at most one file was still being fetched


def test_a_failed_file_is_reported_once_with_its_task_and_later_tasks_are_dropped():
    def fetch(source, dst_root, index, rel, size, mtime_ns):
        if rel == "f3.bin":
            raise OSError(5, "no such object (404 NoSuchKey)")
        return index, size

    replies = run_in_flight(tasks_of_one_file(4), 1, fetch)
    failures = [r for r in replies if isinstance(r, Failure)]
    assert [r.task for r in replies if isinstance(r, Staged)] == [0, 1, 2]
    assert len(failures) == 1
    failure = failures[0]
    assert (failure.stage, failure.epoch, failure.step, failure.path) == ("prefetch", 0, 3, "f3.bin")
    assert "cannot stage s3://bucket/f3.bin" in failure.message and "404 NoSuchKey" in failure.message


def test_a_file_tree_with_files_in_flight_delivers_every_sample_once_with_the_sources_bytes(slow_source, tmp_path):
    # Two prefetchers of four fetch threads each, over the FUSE emulator: the same plan and bytes as one at a time.
    cfg = make_config(slow_source, tmp_path / "local", dataset={"requests_in_flight": 4}, plan={"epochs": 2})
    catalog = load_catalog(cfg)
    with Pipeline(cfg, catalog) as pipe:
        seen = [(b.epoch, b.step, b.indices.tolist(), b.samples) for b in pipe]
        staged = pipe.stats.files_staged
    assert [s[:3] for s in seen] == [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    for _, _, indices, samples in seen:
        for i, (data, label) in zip(indices, samples):
            assert np.array_equal(data, np.load(os.path.join(catalog.root, catalog.path(i)))) and label == catalog.label(i)
    assert staged == len(catalog)
