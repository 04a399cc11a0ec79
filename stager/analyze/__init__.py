"""``stager analyze``: is the training waiting for data, and why (DS-Analyzer's differential method).

One training step (the user's ``module:function``, or ``stager run``'s
simulated compute) is run over the same minibatches three ways:

* **cold** (``phases.cold``): the job as configured, staging from the source
  with its page cache dropped where allowed: the fetch-bound rate;
* **staged** (``phases.staged``): the same minibatches read from a complete,
  warm local copy (the one the cold phase staged), so only preparation
  (reading local files, decoding, collating) stands between the step and
  its data: the preparation-bound rate;
* **synthetic** (``phases.synthetic``): in-memory batches of the same
  shapes and types, made without I/O: the rate of pure compute.

``attribution.py`` turns the three times into stall attributed to
preparation (staged - synthetic) and to fetch (cold - staged), each clipped
at 0; ``report.py`` prints the table and the JSON; ``driver.py`` runs it all.
"""

from .attribution import attribute
from .driver import AnalyzeOptions, analyze
from .report import table

__all__ = ["AnalyzeOptions", "analyze", "attribute", "table"]
