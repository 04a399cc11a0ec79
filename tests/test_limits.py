"""Worker counts the node cannot hold: refused at start, naming the limit, before any worker starts."""

import os
import resource
import subprocess

import pytest
from conftest import make_config, stager_cmd, stager_workers

from stager.engine import Pipeline
from stager.engine.workers.limits import worker_limit_error
from stager.errors import ConfigError

INF = resource.RLIM_INFINITY


def test_a_million_prefetchers_are_refused_before_anything_starts(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"prefetchers": 1_000_000})
    pipe = Pipeline(cfg)
    with pytest.raises(ConfigError, match=r"staging.prefetchers = 1000000, reader.workers = 2: .*(RLIMIT_NOFILE|"
                                          r"RLIMIT_NPROC|MiB available)"):
        pipe.start()
    assert not stager_workers()
    assert not os.path.exists(tmp_path / "local"), "nothing may be made before the counts are checked"


def test_the_open_file_limit_is_named_by_the_command_without_a_traceback(dataset, tmp_path):
    root, _ = dataset
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset:\n  source: {root}\n  manifest: manifest.tsv\n"
                   f"staging:\n  local_dir: {tmp_path / 'local'}\n  prefetchers: 100\nreader:\n  workers: 2\n")

    def lower_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.run(stager_cmd("run", str(job), "--quiet"), capture_output=True, text=True, timeout=120,
                          preexec_fn=lower_nofile)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("stager: error: staging.prefetchers = 100, reader.workers = 2: 102 worker processes "
                                   "need about 472 open files in this process, more than its RLIMIT_NOFILE "
                                   "(ulimit -n) of 256: lower the counts or raise the limit")
    assert not os.path.exists(tmp_path / "local")


@pytest.mark.parametrize("own,node,nofile,nproc,tasks,mem,limit", [
    (10, 10, 1024, INF, 0, 1 << 40, None),
    (300, 300, 1024, INF, 0, 1 << 40, "RLIMIT_NOFILE (ulimit -n) of 1024"),
    (10, 40, 1024, 4096, 4090, 1 << 40, "beside the 4090 processes and threads this user runs, exceed RLIMIT_NPROC"),
    (10, 40, 1024, 4096, 100, 1 << 40, None),
    (10, 70, INF, INF, 0, 1 << 30, "need at least 1120 MiB (16 MiB each), more than the 1024 MiB available"),
    (10, 10, INF, INF, 0, None, None),
])
def test_the_rule_names_the_limit_that_applies(own, node, nofile, nproc, tasks, mem, limit):
    message = worker_limit_error("counts", own, node, nofile, nproc, tasks, mem)
    assert (message is None) if limit is None else (limit in message), message
