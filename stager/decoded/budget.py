"""How many bytes of decoded copies a node may keep: what its capacity leaves beside the encoded ones.

The encoded copies come first: they are what the plan's cache counts on, and
a decoded copy is only a faster way to the same sample. So the decoded tier
gets the room the node would hold were every file of the dataset staged
(the capacity, or where it is unbounded this job's share of the free
space), and none where the encoded copies alone do not fit: there the
samples are read encoded, as with ``staging.decoded: off``.
"""

from ..cache import human
from ..storage import free_share

MIN_ROOM = 1 << 20  # less is not worth a tier: one segment of the smallest size


def tier_choice(mode, pure, once, capacity, job_dir, dataset_bytes):
    """``(bytes, why)`` for a job: no tier where it is off, its loader not pure or its plan one epoch; else its room.

    The cheap reasons come first: only a tier that may be made looks at the
    local file system (``decoded_budget``).

    Args:
        pure: The samples' loader is known to be pure (``SampleDecoder.keeps_decoded``).
        once: The plan reads each sample once.
        Others: As ``decoded_budget``.
    """
    if mode != "off" and not pure:
        return 0, "none: the samples' loader is not one known to be pure (docs/decoded.md)"
    if mode != "off" and once:
        return 0, "none: the plan reads each sample once"
    return decoded_budget(mode, capacity, job_dir, dataset_bytes)


def decoded_budget(mode, capacity, job_dir, dataset_bytes):
    """``(bytes, why)``: the decoded tier's room on this node, and the sentence that says how it was chosen.

    Args:
        mode: ``staging.decoded``.
        capacity: The node cache's capacity in bytes, or None (unbounded).
        job_dir: The job's directory (made).
        dataset_bytes: Bytes of the files this node could ever stage.
    """
    if mode == "off":
        return 0, "staging.decoded is off"
    if capacity is None:
        room, where = free_share(job_dir)
    else:
        room, where = capacity, f"staging.capacity {human(capacity)}"
    left = room - dataset_bytes
    if left < MIN_ROOM:
        return 0, (f"none: {where} does not hold the dataset's {human(dataset_bytes)} and {human(MIN_ROOM)} of "
                   "decoded copies beside it, so samples are read encoded")
    return left, f"{human(left)}: {where}, less the dataset's {human(dataset_bytes)} of encoded copies"
