"""The ends of a rank's plan: its first minibatch is asked for alone, and the pipeline closes behind its last."""

import json
import os

import pytest
from conftest import load_catalog, make_config, stager_workers
from exit_check import run_to_exit
from helpers.watch import wait_removed

from stager import plan
from stager.engine import Pipeline


def steps(cfg, catalog):
    return sum(1 for _ in plan.iterate(len(catalog), cfg.plan))


def source_bytes(catalog, index):
    with open(os.path.join(catalog.root, catalog.path(index)), "rb") as fh:
        return fh.read()


def test_workers_and_directory_go_while_the_consumer_still_holds_the_last_minibatches(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", dataset={"loader": "raw"}, plan={"epochs": 2})
    catalog = load_catalog(cfg)
    with Pipeline(cfg, catalog) as pipe:
        local = pipe.local_dir
        batches = [next(pipe) for _ in range(steps(cfg, catalog))]  # the whole plan; its end not met yet
        assert wait_removed(local), "the job directory must go once every minibatch is delivered"
        assert stager_workers() == []
        assert not pipe.closed, "closed only once the consumer meets the end"
        # Delivered minibatches live in shared memory that outlives the readers.
        for batch in batches:
            for index, (data, label) in zip(batch.indices.tolist(), batch.samples):
                assert data == source_bytes(catalog, index) and label == catalog.label(index)
        with pytest.raises(StopIteration):
            next(pipe)
        assert pipe.closed
        with pytest.raises(StopIteration):
            next(pipe)
    assert [b.step for b in batches] == [m.step for m in plan.iterate(len(catalog), cfg.plan)]


def test_close_while_the_last_minibatches_wait_drops_them(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", dataset={"loader": "raw"},
                      staging={"lookahead": 4}, reader={"ahead": 4})
    catalog = load_catalog(cfg)
    with Pipeline(cfg, catalog) as pipe:
        local = pipe.local_dir
        for _ in range(steps(cfg, catalog) - 3):
            next(pipe)
        assert wait_removed(local)  # the last three are decoded and waiting
        assert not pipe.closed
        pipe.close()
        assert pipe.closed
        with pytest.raises(StopIteration):
            next(pipe)
        pipe.close()  # twice is fine


def test_the_first_minibatch_is_asked_for_alone_then_the_look_ahead(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"lookahead": 4}, plan={"epochs": 1})
    catalog = load_catalog(cfg)
    with Pipeline(cfg, catalog) as pipe:
        count = sum(1 for _ in pipe)
        events = pipe.stats.telemetry.events()
    first_read = min(t for t, kind, seq, *_ in events if kind == "read" and seq == 0)
    needed = {seq: t for t, kind, seq, *_ in events if kind == "needed"}
    assert sorted(needed) == list(range(count))
    assert all(needed[seq] >= first_read for seq in needed if seq), \
        "the look-ahead is asked for only once the first minibatch is read"



def test_a_script_that_exits_after_its_last_minibatch_waits_for_the_close(dataset, tmp_path):
    root, _ = dataset
    config = {"dataset": {"source": root, "manifest": "manifest.tsv", "loader": "raw"},
              "plan": {"batch_size": 8}, "staging": {"local_dir": str(tmp_path / "local")},
              "reader": {"workers": 2}}
    # Every minibatch taken, the end never met, nothing closed: the close behind the plan's end is
    # under way (or done) when the interpreter exits.
    rc, out, err, left = run_to_exit(
        "import json\n"
        "from stager import plan\n"
        "from stager.config import config_from_dict\n"
        "from stager import Pipeline\n"
        "cfg = config_from_dict(json.loads(sys.argv[1]))\n"
        "pipe = Pipeline(cfg).start()\n"
        "batches = [next(pipe) for _ in plan.iterate(len(pipe.catalog), cfg.plan)]\n"
        "report_children()\n", json.dumps(config))
    assert rc == 0 and not err.strip(), err
    assert "CHILDREN" in out and not left, "workers outlived the interpreter"
    assert os.listdir(tmp_path / "local") == [], "the job directory is removed before the interpreter is gone"
