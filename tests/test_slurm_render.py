"""Rendering the sbatch templates: golden files, hostile values, bad keys.

When a template or the renderer changes on purpose, regenerate the golden
files with:  STAGER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_slurm_render.py
and review the diff.
"""

import os
import subprocess

import pytest

from conftest import REPO, stager_cmd
from stager import slurm
from stager.config import config_from_dict
from stager.errors import ConfigError

GOLDEN = os.path.join(REPO, "tests", "golden")

CASES = {
    "srun": {"slurm": {"nodes": 4, "tasks_per_node": 4, "gpus_per_node": 4, "time": "02:30:00",
                       "partition": "gpu", "venv": "/opt/stager/.venv"}},
    "mpirun": {"slurm": {"nodes": 2, "tasks_per_node": 8, "account": "proj42", "requeue": True,
                         "venv": "/opt/stager/.venv", "local_dir": "/local/nvme"}},
    "single": {"slurm": {"tasks_per_node": 2, "signal_s": 0, "venv": "/opt/stager/.venv",
                         "command": ["python", "train.py", "--epochs", "3"]}},
    # Spaces, quotes, ';', '$(...)' and newlines must reach the job as data, never as shell.
    "hostile": {"slurm": {"template": "srun", "venv": "/opt/my venv/it's \"here\"",
                          "local_dir": "/scratch/a;b\nrm -rf ~",
                          "command": ["python", "train it.py", "--name=$(whoami)", "a'b", "x;y", "`id`"]}},
}
CONFIG_PATH = "/jobs/my job/config.yaml"


def rendered(name):
    cfg = config_from_dict(CASES[name])
    with open(slurm.template_path(cfg.slurm.template if name == "hostile" else name)) as fh:
        return slurm.render(fh.read(), cfg, CONFIG_PATH)


@pytest.mark.parametrize("name", list(CASES))
def test_rendered_templates_match_their_golden_files(name):
    path = os.path.join(GOLDEN, f"{name}.sbatch")
    text = rendered(name)
    if os.environ.get("STAGER_UPDATE_GOLDEN"):
        with open(path, "w") as fh:
            fh.write(text)
    with open(path) as fh:
        expected = fh.read()
    assert text == expected, (f"{name}.sbatch differs from {path}; if the change is intended, regenerate "
                              "with STAGER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_slurm_render.py")


@pytest.mark.parametrize("name", list(CASES))
def test_rendered_scripts_are_valid_bash_that_keeps_values_as_data(name, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(rendered(name))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # Evaluate the assignment block alone and read the values back.
    lines = rendered(name).split("\nset -euo pipefail")[0]
    probe = lines + '\nprintf "%s\\0" "$STAGER_VENV" "$STAGER_CONFIG" "$STAGER_LOCAL_DIR" "${STAGER_COMMAND[@]}"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, cwd=tmp_path, check=True).stdout
    values = out.decode().split("\0")[:-1]
    cfg = config_from_dict(CASES[name])
    assert values[0] == cfg.slurm.venv and values[1] == CONFIG_PATH
    assert values[2] == (cfg.slurm.local_dir or "")
    assert values[3:] == cfg.slurm.command
    assert not list(tmp_path.iterdir())[1:], "evaluating the values must not run anything"


def test_directives_follow_the_config():
    text = rendered("srun")
    assert "#SBATCH --nodes=4\n" in text and "#SBATCH --ntasks-per-node=4\n" in text
    assert "#SBATCH --gpus-per-node=4\n" in text and "##SBATCH --cpus-per-task=8\n" in text
    assert "#SBATCH --partition=gpu\n" in text and "##SBATCH --account=myproject\n" in text
    single = rendered("single")
    assert "##SBATCH --signal=TERM@120\n" in single and "#SBATCH --nodes=1\n" in single


@pytest.mark.parametrize("key,value", [("job_name", "my job"), ("partition", "gpu\n#SBATCH --x"),
                                       ("output", "out file.log"), ("time", "1:00;rm")])
def test_unsafe_directive_values_are_refused_by_key(key, value):
    cfg = config_from_dict({"slurm": {key: value}})
    with pytest.raises(ConfigError, match=f"slurm.{key}: .* cannot go into an #SBATCH line"):
        slurm.render("#SBATCH --job-name=x\n", cfg, CONFIG_PATH)


def test_render_command_rejects_unknown_parameters_and_templates(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("slurm:\n  nodes: 2\n")
    proc = subprocess.run(stager_cmd("slurm", "render", "--config", str(cfg), "--set", "slurm.gpus=4"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'slurm.gpus'" in proc.stderr and "gpus_per_node = 0" in proc.stderr
    proc = subprocess.run(stager_cmd("slurm", "render", "--config", str(cfg), "--template", "pbs"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "valid templates: srun, mpirun, single" in proc.stderr
    out = tmp_path / "job.sbatch"
    proc = subprocess.run(stager_cmd("slurm", "render", "--config", str(cfg), "-o", str(out)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "#SBATCH --nodes=2" in out.read_text() and os.access(out, os.X_OK)
