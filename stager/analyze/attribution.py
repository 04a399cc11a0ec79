"""DS-Analyzer's differential attribution: pure arithmetic on the three phases' times."""

BOTTLENECKS = ("compute", "preparation", "fetch")


def attribute(synthetic_s, staged_s, cold_s, negligible=0.05):
    """Splits the cold run's time into compute, preparation stall and fetch stall.

    Every time is for the same minibatches. Preparation stall is what a
    complete local copy adds to pure compute (``staged - synthetic``); fetch
    stall is what reading from the source adds to that (``cold - staged``).
    Each is clipped at 0: a difference below 0 is noise, not a gain. So that
    the parts add up to the cold run (compute + preparation + fetch), both
    are also capped: together they are at most the whole stall
    ``cold - synthetic`` (a staged run measured slower than the cold one, or
    faster than the synthetic one, is noise too).

    Args:
        synthetic_s: Seconds with synthetic in-memory minibatches.
        staged_s: Seconds with every file already local and warm.
        cold_s: Seconds staging from the source, cold.
        negligible: A stall below this fraction of ``cold_s`` does not make
            its stage the bottleneck.

    Returns:
        A dictionary: ``compute_s`` (``synthetic_s``), ``prep_stall_s``,
        ``fetch_stall_s``, ``stall_s`` (their sum), each also as a fraction
        of ``cold_s`` (``*_fraction``), and
        ``bottleneck``: ``fetch`` or ``preparation`` (the larger stall) or
        ``compute`` when both are negligible.
    """
    total = max(0.0, cold_s - synthetic_s)
    prep = min(max(0.0, staged_s - synthetic_s), total)
    fetch = min(max(0.0, cold_s - staged_s), total - prep)

    def share(x):
        return round(x / cold_s, 4) if cold_s > 0 else 0.0

    if max(prep, fetch) <= negligible * cold_s:
        bottleneck = "compute"
    else:
        bottleneck = "fetch" if fetch >= prep else "preparation"
    return {"compute_s": round(synthetic_s, 4), "compute_fraction": share(min(synthetic_s, cold_s)),
            "prep_stall_s": round(prep, 4), "fetch_stall_s": round(fetch, 4), "stall_s": round(prep + fetch, 4),
            "prep_fraction": share(prep), "fetch_fraction": share(fetch), "stall_fraction": share(prep + fetch),
            "bottleneck": bottleneck}
