"""What an ``MPI_Abort`` leaves on the node: the aborting rank removes MPICH's shared-memory segment.

MPICH unlinks its node's ``/dev/shm/mpich_shm_*`` segment itself some time
after every local rank has attached (a stager run's first collectives are
usually enough); a job that aborts before that left it behind.
"""

import os
import subprocess
import sys
import textwrap

from conftest import REPO
from test_mpi_run import MPIEXEC, pytestmark  # noqa: F401 (the skip mark without mpiexec)

_EARLY_FAILURE = textwrap.dedent("""
    import glob
    from stager.world import detect, install_abort_hook
    world = detect("on", "mpi")
    install_abort_hook(world)
    world.comm.Barrier()
    mapped = {line.split()[-1] for line in open("/proc/self/maps") if "/dev/shm/mpich_shm_" in line}
    with open(f"mapped-{world.rank}", "w") as fh:  # a file each: the ranks' stdout lines interleave
        fh.write(" ".join(sorted(mapped)))
    world.comm.Barrier()
    if world.rank == 1:
        raise RuntimeError("an early failure")
    world.comm.Barrier()
""")


def test_a_job_aborted_early_leaves_no_mpich_segment(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", _EARLY_FAILURE], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "an early failure" in proc.stderr and "aborting the MPI job" in proc.stderr
    segments = {path for rank in (0, 1) for path in (tmp_path / f"mapped-{rank}").read_text().split()}
    assert segments and all(path.startswith("/dev/shm/mpich_shm_") for path in segments), segments
    assert not [path for path in segments if os.path.exists(path)], "MPICH's segment outlived the aborted job"
