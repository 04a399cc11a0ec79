"""Where the time goes: a run's accounting, its stall report and its advice.

- ``accounting``: one rank's record from its pipeline's event log, and the
  job's measured stage rates;
- ``collect``: the report JSON, gathered from every rank;
- ``summary``: the report as text; ``advice``: the bottleneck and what to
  change; ``plots``: the PNG plots.
"""

import json

from .summary import ReportError, check

__all__ = ["ReportError", "load_report"]


def load_report(path):
    """Reads and checks a report file.

    Raises:
        ReportError: The file is missing, not JSON, or lacks the accounting.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (write one with 'stager run CONFIG --report {path}')") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    check(report, path)
    return report
