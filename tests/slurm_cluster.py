"""A real single-node Slurm cluster (Debian's slurmctld, slurmd and munge),
started and stopped by the tests that need it. Every call has a time limit."""

import os
import shutil
import subprocess
import time

CONF = """\
ClusterName=stagertest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=10
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "munged", "munge")


def unavailable():
    """Why Slurm cannot run here, or None."""
    if os.geteuid() != 0:
        return "a single-node Slurm needs root (slurmd, munged)"
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"Slurm packages missing ({', '.join(missing)}): apt-get install slurmd slurmctld slurm-client munge"
    if not os.path.exists("/etc/munge/munge.key"):
        return "no /etc/munge/munge.key (the munge package creates it)"
    return None


def _tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """Owns slurmctld and slurmd (foreground children) and, if it started it, munged."""

    def __init__(self, root):
        self.root = root
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.procs = []
        self.started_munge = False

    def run(self, *args, timeout=60, check=True):
        return subprocess.run([_tool(args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def start(self):
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        with open(self.conf, "w") as fh:
            fh.write(CONF.format(root=self.root))
        if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True, timeout=10).returncode != 0:
            os.makedirs("/run/munge", exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", _tool("munged")], check=True, timeout=30)
            self.started_munge = True
        log = open(os.path.join(self.root, "daemons.log"), "ab")
        self.procs.append(subprocess.Popen([_tool("slurmctld"), "-D", "-f", self.conf], env=self.env,
                                           stdout=log, stderr=log))
        self.procs.append(subprocess.Popen([_tool("slurmd"), "-D", "-N", "localhost", "-f", self.conf],
                                           env=self.env, stdout=log, stderr=log))
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # no event to wait on: ask the controller
            state = self.run("sinfo", "-h", "-o", "%t", check=False, timeout=10).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Slurm did not become ready (node state {state!r}); see {self.root}/*.log")

    def stop(self):
        self.run("scontrol", "shutdown", check=False, timeout=30)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        if self.started_munge:
            subprocess.run(["runuser", "-u", "munge", "--", _tool("munged"), "--stop"], capture_output=True,
                           timeout=30)
            self.started_munge = False

    def job_state(self, job):
        out = self.run("squeue", "-h", "-j", str(job), "-o", "%T", check=False, timeout=10).stdout.strip()
        return out or None
