"""What happened and where the time went: events, running totals, the stall accounting and its report.

``events`` records every minibatch's events (``Telemetry``, the event
kinds); ``stats`` keeps the running totals over them; ``accounting`` turns
one rank's events into its record and the job's stage rates; ``collect``
gathers the records into the report JSON; ``ledger`` turns the ``EPOCH_CPU``
marks into each epoch's CPU a sample by process kind; ``summary`` renders it and
``advice`` names the bottleneck; ``plots`` draws it.

May import: ``errors``.
"""

from .accounting import account, job_nodes, job_stages
from .collect import job_summary, pipeline_report, rank_summary, write_report
from .events import (CONSUMED, DELIVERED, DROPPED, EVICTED, FALLBACK, FILE_EVENTS_KEPT, FILE_KINDS, FINISHED, GROUP,
                     DECODED, EPOCH_CPU, GROUP_FETCHED, GROUP_FILES, GROUP_GIVEN, GROUP_TAKEN, KINDS, LOCAL, NEEDED, NO_SPACE, PEER, POOL_IN_FLIGHT, POOL_LOOKAHEAD, POOL_PREFETCH, POOL_READ, PRESENT, QUEUED, READ,
                     READY, REQUEST, RESIZED, SERVED, STAGED, SWAPPED_IN, SWAPPED_OUT, TASK, TASK_CPU, USAGE, Telemetry)
from .stats import BatchTimes, Stats
from .summary import ReportError, check, load_report, render

__all__ = ["BatchTimes", "CONSUMED", "DELIVERED", "DROPPED", "EVICTED", "FALLBACK", "FILE_EVENTS_KEPT", "FILE_KINDS", "FINISHED",
           "GROUP", "GROUP_FETCHED",
           "DECODED", "EPOCH_CPU", "GROUP_FILES", "GROUP_GIVEN", "GROUP_TAKEN", "KINDS", "LOCAL", "NEEDED",
           "NO_SPACE", "PEER", "POOL_IN_FLIGHT", "POOL_LOOKAHEAD", "POOL_PREFETCH", "POOL_READ",
           "PRESENT", "QUEUED", "READ", "READY", "REQUEST", "RESIZED", "ReportError", "SERVED", "STAGED", "Stats", "SWAPPED_IN", "SWAPPED_OUT", "TASK_CPU",
           "TASK", "Telemetry", "USAGE", "account", "check", "job_nodes", "job_stages", "job_summary", "load_report",
           "pipeline_report", "rank_summary", "render", "write_report"]
