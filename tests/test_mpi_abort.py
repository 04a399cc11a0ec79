"""What an ``MPI_Abort`` leaves on the node: MPICH's shared-memory segment is removed by the aborting rank."""

import glob
import os

from conftest import REPO
from test_mpi_run import LAYOUTS, assert_nothing_left, mpirun, pytestmark, write_job  # noqa: F401 (skip mark)


def test_an_aborted_job_leaves_no_mpich_segment(tmp_path):
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    job = write_job(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests", "helpers")]))
    proc = mpirun(LAYOUTS["4 ranks on 2 nodes"],
                  ["run", job, "--quiet", "--set", "dataset.loader=faults:fail_on_rank_2",
                   "--set", "run.compute_ms=5", "--set", "plan.epochs=0"], tmp_path, timeout=120, env=env)
    assert proc.returncode != 0 and "aborting the MPI job" in proc.stderr, proc.stderr
    assert set(glob.glob("/dev/shm/mpich_shm_*")) - before == set()
    assert_nothing_left(tmp_path, job)
