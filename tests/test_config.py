import os

import pytest

from conftest import REPO
from stager.config import Config, config_from_dict, load_config
from stager.job.demo import DEMO
from stager.errors import ConfigError


def write(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    return str(path)


def test_defaults_load_from_an_empty_file(tmp_path):
    assert load_config(write(tmp_path / "c.yaml", "")) == Config()


def test_unknown_key_is_named_with_the_valid_keys_and_defaults(tmp_path):
    path = write(tmp_path / "c.yaml", "staging:\n  prefetcher: 8\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert path in text and "'staging.prefetcher'" in text
    assert "prefetchers = 'auto'" in text and "lookahead = 'auto'" in text


def test_unknown_section_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"(?s)unknown key\(s\) 'stagin' in top level.*staging: \(section\)"):
        load_config(write(tmp_path / "c.yaml", "stagin: {}\n"))


@pytest.mark.parametrize("text,message", [
    ("plan:\n  batch_size: '32'\n", r"plan.batch_size: expected int, got '32'"),
    ("plan:\n  shuffle: 1\n", r"plan.shuffle: expected bool, got 1"),
    ("staging:\n  local_dir: [a]\n", r"staging.local_dir: expected str or null"),
    ("dataset:\n  extensions: .npy\n", r"dataset.extensions: expected list of str"),
    ("plan: 3\n", r"plan: expected a mapping"),
    ("plan:\n  batch_size: 0\n", r"plan.batch_size must be at least 1"),
    ("dataset:\n  loader: nosuch\n", r"dataset.loader: 'nosuch' is neither"),
    ("processes:\n  start_method: thread\n", r"processes.start_method must be one of"),
    ("world:\n  backend: nccl\n", r"world.backend must be 'auto', 'mpi', 'torch' or 'none', not 'nccl'"),
])
def test_wrong_types_and_values_are_named(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "c.yaml", text))


def test_overrides_are_typed_and_checked(tmp_path):
    path = write(tmp_path / "c.yaml", "plan:\n  epochs: 2\n")
    cfg = load_config(path, ["plan.epochs=5", "staging.keep=true", "staging.local_dir=rel"])
    assert cfg.plan.epochs == 5 and cfg.staging.keep is True
    assert cfg.staging.local_dir == os.path.join(os.getcwd(), "rel")
    with pytest.raises(ConfigError, match="plan.epochs: expected int"):
        load_config(path, ["plan.epochs=many"])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(path, ["plan.epochs"])


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    os.mkdir(tmp_path / "sub")
    cfg = load_config(write(tmp_path / "sub" / "c.yaml", "dataset:\n  source: ../data\n  manifest: m.tsv\n"))
    assert cfg.dataset.source == str(tmp_path / "data")
    assert cfg.dataset.manifest == "m.tsv"  # relative to the source, not to the file


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path / "c.yaml", "plan: [\n"))


def test_shipped_demo_config_matches_the_embedded_demo():
    shipped = load_config(os.path.join(REPO, "configs", "demo.yaml"))
    embedded = config_from_dict(DEMO, base_dir=os.path.join(REPO, ".demo"))
    assert shipped == embedded


def test_example_config_loads():
    cfg = load_config(os.path.join(REPO, "configs", "example.yaml"))
    assert cfg.staging.prefetchers == 12 and cfg.dataset.manifest == "train.tsv"


def test_a_bare_on_or_off_in_yaml_is_the_word_for_a_text_key(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", "world: {mpi: off}\nstaging: {peers: off}\n"), ["world.mpi=on"])
    assert (cfg.world.mpi, cfg.staging.peers) == ("on", "off")
    with pytest.raises(ConfigError, match="staging.peers must be 'off' or 'partition', not 'on'"):
        load_config(write(tmp_path / "d.yaml", "staging: {peers: on}\n"))
