"""``unbounded``: keep every file staged until the job ends (no capacity limit).

A file is fetched at most once per node and job, so later epochs read it
locally; the node's directory grows toward the files its ranks read.
"""


class Unbounded:
    """Never removes a file."""

    name = "unbounded"

    def released(self, cache, indices):
        return []

    def victims(self, cache, nbytes):
        return []
