"""``stager analyze``'s summary table and advice, from its result dictionary."""

_LABELS = {"synthetic": "synthetic (pure compute)", "staged": "staged (preparation-bound)",
           "cold": "cold (fetch-bound)"}


def advice(result):
    """One sentence on what to change, tied to the measured numbers."""
    att, phases, cfg = result["stall"], result["phases"], result["settings"]
    cold, staged, pure = (f"{phases[p]['samples_per_s'] or 0:,.1f}" for p in ("cold", "staged", "synthetic"))
    if att["bottleneck"] == "fetch":
        return (f"fetching from the source is the bottleneck: {cold} samples/s cold against {staged} from a local "
                f"copy with {cfg['prefetchers']} prefetcher(s); try more staging.prefetchers or a longer "
                f"staging.lookahead (now {cfg['lookahead']}), or keep the data staged between jobs (staging.keep)")
    if att["bottleneck"] == "preparation":
        return (f"preparing minibatches is the bottleneck: {staged} samples/s from a warm local copy against "
                f"{pure} for the step alone with {cfg['readers']} reader(s); try more reader.workers, or a cheaper "
                f"loader or decode")
    return "the step is not waiting for data: both stalls are under 5% of the cold run's time"


def table(result):
    """The summary as text: one row per phase, then the attribution and the advice."""
    s = result["settings"]
    lines = [f"stager analyze: {s['batches']} minibatches of up to {s['batch_size']} samples timed per phase "
             f"(after {s['warmup']} warm-up); step: {result['step']}; collate: {s['collate']}",
             f"  {'phase':<28}{'wall s':>9}{'samples/s':>12}{'waiting s':>11}{'in step s':>11}{'first s':>9}"]
    for name in ("synthetic", "staged", "cold"):
        p = result["phases"][name]
        rate = "-" if p["samples_per_s"] is None else f"{p['samples_per_s']:.1f}"
        lines.append(f"  {_LABELS[name]:<28}{p['wall_s']:>9.3f}{rate:>12}{p['wait_s']:>11.3f}{p['step_s']:>11.3f}"
                     f"{p['first_s']:>9.3f}")
    att = result["stall"]
    lines.append(f"  stall from preparation (staged - synthetic): {att['prep_stall_s']:.3f} s "
                 f"({att['prep_fraction']:.1%} of cold)")
    lines.append(f"  stall from fetch       (cold - staged):      {att['fetch_stall_s']:.3f} s "
                 f"({att['fetch_fraction']:.1%} of cold)")
    cache = "dropped" if result["page_cache_dropped"] else "not dropped"
    lines.append(f"  bottleneck: {att['bottleneck']} (page cache {cache} before the cold phase)")
    lines.append(f"  advice: {advice(result)}")
    return "\n".join(lines)
