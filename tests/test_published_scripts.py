"""A training script in the published style runs with one line changed, under torchrun and alone.

The same script runs twice, with DataLoader and with StagedLoader as its
training loader (``tests/helpers/published_train.py``); what each rank
trained on, epoch by epoch, must be equal, and the staged run must read
each training JPEG from the source once for the node.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.opens import Opens
from test_torch_dropin import write_jpegs
from test_torchrun import TORCHRUN, agents, torch_env

pytest.importorskip("torchvision")

SCRIPT = os.path.join(os.path.dirname(__file__), "helpers", "published_train.py")


def alone(tmp_path, args):
    proc = subprocess.run([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=tmp_path, env=torch_env(tmp_path), timeout=300)
    return [(proc.returncode, proc.stdout)]


def launch(tmp_path, how, loader):
    args = [str(tmp_path / "train"), str(tmp_path / "val"), str(tmp_path / "out"), str(tmp_path / "local"), loader]
    results = agents(tmp_path, [SCRIPT, *args], nproc=2) if how == "torchrun" else alone(tmp_path, args)
    for rc, output in results:
        assert rc == 0, output
    ranks = 2 if how == "torchrun" else 1
    return [json.loads((tmp_path / "out" / f"{loader}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("how", ["torchrun", "alone"])
def test_the_published_patterns_train_on_dataloaders_samples_reading_each_file_once(tmp_path, how):
    if how == "torchrun" and not os.path.exists(TORCHRUN):
        pytest.skip(f"no torchrun at {TORCHRUN}")
    root = write_jpegs(str(tmp_path / "train"), per_class=11)
    write_jpegs(str(tmp_path / "val"), per_class=3, seed=1)
    (tmp_path / "out").mkdir()
    want = launch(tmp_path, how, "dataloader")
    with Opens(root) as opens:
        got = launch(tmp_path, how, "staged")
        counts = opens.count()
    for r, (ours, theirs) in enumerate(zip(got, want)):
        for epoch in ("0", "1"):
            keys = [(s["indices"], s["labels"]) for s in ours["train"][epoch]]
            assert keys == [(s["indices"], s["labels"]) for s in theirs["train"][epoch]], f"rank {r} epoch {epoch}"
            assert all(s["soft"] == [4, 3] for s in ours["train"][epoch]), "MixUp/CutMix ran in the collate_fn"
        assert ours["evaluated"] == theirs["evaluated"]
        assert ours["len"] == theirs["len"] == len(ours["train"]["0"])
    epochs = [[i for rank in got for s in rank["train"][e] for i in s["indices"]] for e in ("0", "1")]
    assert epochs[0] != epochs[1], "each epoch its own order"
    assert all(len(set(e)) == len(e) for e in epochs), "drop_last: no sample twice in an epoch"
    files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    assert dict(counts) == {f: 1 for f in files}, "each training JPEG is read from the source once for the node"
    assert os.listdir(tmp_path / "local") == []
