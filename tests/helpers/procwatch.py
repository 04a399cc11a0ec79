"""Every process of a running job, sampled over its epochs: memory, open files, the staging directory.

Used by the long-run test and ``benchmarks/studies/long_run.py``. A sample is taken
every ``interval_s`` (nothing happens to wait on: the job runs on its own),
for each process below the launcher: its name, resident memory and open
descriptors; with it the epoch rank 0 has recorded and the bytes and files
under the staging directory.
"""

import os
import threading

from stager.bench.cpu import descendants


def _name(pid):
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.index("(") + 1:text.rindex(")")]


def _parent(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0  # a zombie has none


def _tree_bytes(root):
    total = files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
            except OSError:
                pass  # evicted between the listing and the reading
    return total, files


class ProcWatch:
    """Samples the processes below ``root_pid`` in a thread until ``stop()``.

    Args:
        root_pid: The launcher (mpiexec); or a callable returning the pids
            to watch now, each with the processes below it (several jobs and
            the service they share).
        record: Rank 0's record file (``--record``): one line a minibatch.
        steps: Minibatches of rank 0 in an epoch.
        local_dir: The job's ``staging.local_dir``; or a callable returning
            the directories to measure now (a shared staging directory and shelf).
        interval_s: Seconds between samples.

    Attributes:
        samples: ``[{"epoch", "local_bytes", "local_files", "procs": {pid: (name, rss KiB, open fds)}}]``.
        parents: ``{pid: its parent's name}``, as first seen.
    """

    def __init__(self, root_pid, record, steps, local_dir, interval_s=0.5):
        self.root_pid, self.record, self.steps, self.local_dir = root_pid, record, steps, local_dir
        self.interval_s = interval_s
        self.samples, self.parents = [], {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="procwatch", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._halt.set()
        self._thread.join()

    def _epoch(self):
        try:
            with open(self.record, "rb") as fh:
                return fh.read().count(b"\n") // self.steps
        except FileNotFoundError:
            return -1

    def _run(self):
        while not self._halt.wait(self.interval_s):
            procs = {}
            roots = self.root_pid() if callable(self.root_pid) else []
            watched = set(roots).union(*(descendants(r) for r in roots)) if roots else descendants(self.root_pid)
            for pid in watched:
                try:
                    procs[pid] = (_name(pid), _rss_kib(pid), len(os.listdir(f"/proc/{pid}/fd")))
                    if pid not in self.parents:
                        self.parents[pid] = _name(_parent(pid))
                except (OSError, ValueError):
                    pass  # exited between the listing and the reading
            local_bytes = local_files = 0
            for root in self.local_dir() if callable(self.local_dir) else [self.local_dir]:
                nbytes, files = _tree_bytes(root)
                local_bytes, local_files = local_bytes + nbytes, local_files + files
            self.samples.append({"epoch": self._epoch(), "local_bytes": local_bytes, "local_files": local_files,
                                 "procs": procs})

    def per_process(self, first, last):
        """``{pid: (name, median RSS KiB, most fds, fewest fds)}`` over the samples of epochs ``first`` to ``last - 1``.

        The median, not the most: a large temporary (a numpy array above
        malloc's mmap threshold) shows in one sample and is gone in the next.
        The fewest descriptors are those held throughout (a leak raises
        them), without the files a worker has open for a moment.
        """
        seen = {}
        for sample in self.samples:
            if first <= sample["epoch"] < last:
                for pid, (name, rss, fds) in sample["procs"].items():
                    seen.setdefault(pid, (name, [], []))
                    seen[pid][1].append(rss)
                    seen[pid][2].append(fds)
        return {pid: (name, sorted(rss)[len(rss) // 2], max(fds), min(fds)) for pid, (name, rss, fds) in seen.items()}
