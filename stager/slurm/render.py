"""Filling the sbatch templates in ``slurm/`` from a config.

The templates are working sbatch scripts: a user may copy one and edit it.
Rendering rewrites the same lines a user would edit: the ``#SBATCH`` options
(``##SBATCH`` when an option is off) and the ``STAGER_*`` assignments.
Values that go into the shell are quoted with ``shlex.quote``; ``#SBATCH``
values, which sbatch reads without a shell, are checked instead and an unsafe
one is refused with the key that holds it.
"""

import os
import re
import shlex
import sys

from ..errors import ConfigError

TEMPLATES = ("srun", "mpirun", "single")
_SAFE = re.compile(r"^[A-Za-z0-9_.,:%@+=/\-]+$")
_DIRECTIVE = re.compile(r"^#{1,2}SBATCH --([a-z-]+)(?:=(.*))?$")
_ASSIGN = re.compile(r"^(STAGER_VENV|STAGER_CONFIG|STAGER_LOCAL_DIR|STAGER_COMMAND)=")


def template_dirs():
    """Where templates are looked for: the source tree, then an installed copy."""
    # stager/slurm/render.py -> the repository root, which holds slurm/*.sbatch
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [os.path.join(here, "slurm"), os.path.join(sys.prefix, "share", "stager", "slurm")]


def template_path(name):
    """Path of the template ``name``, or of ``name`` itself if it is a file."""
    if os.path.isfile(name):
        return name
    if name not in TEMPLATES:
        raise ConfigError(f"unknown template {name!r}; valid templates: {', '.join(TEMPLATES)}")
    for directory in template_dirs():
        path = os.path.join(directory, f"{name}.sbatch")
        if os.path.isfile(path):
            return path
    raise ConfigError(f"template {name}.sbatch not found in {' or '.join(template_dirs())}")


def _directive_value(key, value):
    text = str(value)
    if not _SAFE.match(text):
        raise ConfigError(f"slurm.{key}: {text!r} cannot go into an #SBATCH line (use letters, digits and "
                          "_.,:%@+=/- only)")
    return text


def directives(slurm):
    """``#SBATCH`` option -> value (None: leave the option commented out)."""
    def opt(key, value, on):
        return _directive_value(key, value) if on else None

    return {
        "job-name": opt("job_name", slurm.job_name, True),
        "nodes": opt("nodes", slurm.nodes, True),
        "ntasks-per-node": opt("tasks_per_node", slurm.tasks_per_node, True),
        "cpus-per-task": opt("cpus_per_task", slurm.cpus_per_task, slurm.cpus_per_task > 0),
        "gpus-per-node": opt("gpus_per_node", slurm.gpus_per_node, slurm.gpus_per_node > 0),
        "time": opt("time", slurm.time, True),
        "partition": opt("partition", slurm.partition, slurm.partition is not None),
        "account": opt("account", slurm.account, slurm.account is not None),
        "signal": opt("signal_s", f"TERM@{slurm.signal_s}", slurm.signal_s > 0),
        "requeue": "" if slurm.requeue else None,
        "output": opt("output", slurm.output, True),
    }


def render(text, cfg, config_path):
    """Fills a template's text from a config.

    Args:
        text: The template.
        cfg: A ``Config``; its ``slurm`` section gives the values.
        config_path: The config file the job will run with (made absolute).

    Returns:
        The sbatch script.

    Raises:
        ConfigError: For a value that cannot be written safely, naming its key.
    """
    slurm = cfg.slurm
    options = directives(slurm)
    shell = {
        "STAGER_VENV": shlex.quote(slurm.venv or sys.prefix),
        "STAGER_CONFIG": shlex.quote(os.path.abspath(config_path)),
        "STAGER_LOCAL_DIR": shlex.quote(slurm.local_dir) if slurm.local_dir else "",
        "STAGER_COMMAND": "(" + " ".join(shlex.quote(word) for word in slurm.command) + ")",
    }
    out = []
    for line in text.splitlines():
        match = _DIRECTIVE.match(line)
        if match and match.group(1) in options:
            key, value = match.group(1), options[match.group(1)]
            if value is None:
                line = "##SBATCH --" + key + (f"={match.group(2)}" if match.group(2) is not None else "")
            else:
                line = "#SBATCH --" + key + (f"={value}" if value != "" else "")
        else:
            match = _ASSIGN.match(line)
            if match:
                comment = line.split("#", 1)[1] if "#" in line.split("=", 1)[1] else None
                line = f"{match.group(1)}={shell[match.group(1)]}" + (f"   #{comment}" if comment else "")
        out.append(line)
    return "\n".join(out) + "\n"
