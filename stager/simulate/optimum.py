"""The fewest source reads any cache policy could achieve for a job: Belady's rule over every node's plan.

Every rank's reads follow from the plan, so the whole job's future is known
before it starts. The bound treats the nodes' caches as one store of their
capacities together, in which a file needs one copy to be "held" by the
job, and keeps each node's look-ahead window as the engine does: from the
moment a rank asks for a minibatch (``depth`` steps before reading it) until
it has read it, the minibatch's files occupy room on that rank's node, one
copy per node that has them in its window, whoever else holds them. Outside
windows a held file occupies one copy's room. A file that enters a window
while no node holds it is a source read. When room is needed, the held file
outside every window whose next read by any rank is farthest away goes
(Belady's rule; a file no rank reads again goes at once).

For files of one size this is the optimum of that model: no policy of
stager's engine, which also keeps each window on its own node and reads a
file once for all ranks of a node, can read the source less often. With
sizes that differ, farthest-first is a close heuristic, not a proof.
"""

import heapq
import math

import numpy as np

from ..plan import job_reads


def next_reads(steps, files):
    """Per read of ``plan.job_reads``, the step of the same file's next read by any node (inf: none)."""
    order = np.lexsort((steps, files))
    following = np.full(len(steps), math.inf)
    same = files[order[1:]] == files[order[:-1]]
    following[order[:-1][same]] = steps[order[1:]][same]
    return following


def job_optimum(sizes, spec, node_of_rank, capacities, depth, to_files=None):
    """Source reads of the best policy for ``spec`` on nodes of ``capacities`` with ``depth``-minibatch windows.

    Args:
        sizes: File sizes in bytes.
        spec: The job's ``plan.PlanSpec`` (finite epochs).
        node_of_rank: Per rank, its node's index.
        capacities: Per node, the bytes its cache may hold (None: unbounded).
        depth: Minibatches each rank asks for before reading them
            (``staging.lookahead`` as the run used it).
        to_files: Maps samples to the files holding them, or None.

    Returns:
        A dict: ``files`` and ``bytes`` read from the source in all, and
        ``per_epoch`` (files per epoch, from the plan's first).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    steps, nodes, files, epoch_of_step = job_reads(spec, node_of_rank, to_files, len(sizes))
    per_epoch = np.zeros(len(epoch_of_step) and int(epoch_of_step.max() - epoch_of_step.min()) + 1, dtype=np.int64)
    if any(c is None for c in capacities):
        first = np.unique(files, return_index=True)[1]
        np.add.at(per_epoch, epoch_of_step[steps[first]] - epoch_of_step.min(), 1)
        return {"files": int(len(first)), "bytes": int(sizes[files[first]].sum()), "per_epoch": per_epoch.tolist()}
    capacity = int(sum(capacities))
    following = next_reads(steps, files)
    bounds = np.searchsorted(steps, np.arange(int(steps.max()) + 2 if len(steps) else 1))
    held = np.zeros(len(sizes), dtype=bool)
    windows = {}                        # (node, file) -> minibatches of the window that need it
    in_windows = np.zeros(len(sizes), dtype=np.int64)  # nodes whose window holds the file
    next_use = np.full(len(sizes), math.inf)
    heap = []
    used = read_files = read_bytes = 0
    first_epoch = int(epoch_of_step.min()) if len(epoch_of_step) else 0

    def room(nbytes):
        nonlocal used
        while used + nbytes > capacity and heap:
            key, f = heapq.heappop(heap)
            if held[f] and not in_windows[f] and -key == next_use[f]:
                held[f] = False
                used -= int(sizes[f])

    last = len(bounds) - 1
    for t in range(last + depth - 1):
        if t < last:  # step t enters the windows
            for i in range(bounds[t], bounds[t + 1]):
                f, n = int(files[i]), int(nodes[i])
                count = windows.get((n, f), 0)
                windows[(n, f)] = count + 1
                if count:
                    continue
                # Each node's window copy costs room, except the one the job already counts as held.
                extra = int(sizes[f]) if (in_windows[f] or not held[f]) else 0
                if not held[f]:
                    read_files += 1
                    read_bytes += int(sizes[f])
                    per_epoch[epoch_of_step[t] - first_epoch] += 1
                    held[f] = True
                in_windows[f] += 1
                room(extra)
                used += extra
        c = t - depth + 1
        if 0 <= c < last:  # step c has been read: its windows' pins go
            for i in range(bounds[c], bounds[c + 1]):
                f, n = int(files[i]), int(nodes[i])
                windows[(n, f)] -= 1
                if windows[(n, f)]:
                    continue
                del windows[(n, f)]
                in_windows[f] -= 1
                next_use[f] = following[i]
                if in_windows[f]:
                    used -= int(sizes[f])  # another node's window still has it: one copy fewer
                elif math.isinf(next_use[f]):
                    held[f] = False
                    used -= int(sizes[f])
                else:
                    heapq.heappush(heap, (-next_use[f], f))
    return {"files": read_files, "bytes": read_bytes, "per_epoch": per_epoch.tolist()}
