"""The report's tables of how each arrival rate was served (measures.loadserve): offered against achieved rate and
queueing per arm, and where both arms served the offered load, the paired latency ratios instead of a throughput
ratio (docs/analysis.md, "Verdict per load")."""
from __future__ import annotations

import statistics

from specab.analysis.measures import loadserve
from specab.analysis.measures.concurrency import LoadReport, LoadPoint
from specab.analysis.render.document import Heading, Para, Report, Table


def _med(values: list[float | None], fmt: str = ".3g") -> str:
    v = [x for x in values if x is not None]
    return "-" if not v else format(statistics.median(v), fmt)


def _who(p: LoadPoint, who: str) -> list[str]:
    runs = p.serve.get(who, [])
    kept = sum(1 for s in runs if s.kept_up)
    q95 = [s.queue_p95_s * 1000 if s.queue_p95_s is not None else None for s in runs]
    engine = [s.engine_queue_max for s in runs if s.engine_queue_max is not None]
    why = "; ".join(sorted({s.why for s in runs if not s.kept_up}))
    return [_med([s.offered for s in runs]), _med([s.achieved for s in runs]), _med(q95, ".0f"),
            str(max(engine)) if engine else "-", f"{kept}/{len(runs)}" + (f" ({why})" if why else "")]


def serve_blocks(rep: Report, loads: LoadReport) -> None:
    """The two tables, for the families measured at arrival rates."""
    pts = [(f.name, p) for f in loads.families for p in f.points if p.rate > 0 and p.serve]
    if not pts:
        return
    rep.add(Heading("Offered and achieved load", 3),
            Para(f"Per arrival rate: the rate the requests' seeded schedule offered and the rate their completions "
                 f"achieved (requests per second, median over runs), the 95th percentile of queueing (a request's "
                 f"wait from its scheduled arrival to its first token beyond the run's unloaded TTFT, ms), the "
                 f"engine's most waiting requests by its own log (SGLang's #queue-req, vLLM's Waiting) where it "
                 f"says, and the runs that kept up: achieved within {loadserve.KEEP_UP_TOL:.0%} of offered and no "
                 f"queue building up. Where both arms "
                 f"kept up in every run the load was served and no throughput ratio is stated (it is the arrival "
                 f"rate's by construction): the comparison there is latency."),
            Table(["configuration", "load", "offered req/s", "achieved req/s (arm)", "queue p95 ms (arm)",
                   "engine queue max (arm)", "runs kept up (arm)", "achieved req/s (baseline)",
                   "queue p95 ms (baseline)", "engine queue max (baseline)", "runs kept up (baseline)", "verdict"],
                  [[name, p.label] + _who(p, "arm") + _who(p, "baseline")[1:]
                   + ["served: latency compared" if p.served else "throughput compared"] for name, p in pts]))
    served = [(name, p) for name, p in pts if p.served]
    if served:
        labels = [label for _, _, label in loadserve.LATENCY_RATIOS]
        rep.add(Heading("Latency where both arms served the offered load", 3),
                Para("Paired ratio arm / baseline of each run's latency percentile, geometric mean over blocks with "
                     "its 95% interval (below 1: the arm is faster). TTFT from each request's scheduled arrival; ITL "
                     "per token: each streamed chunk's gap spread over the tokens it carried."),
                Table(["configuration", "load"] + labels,
                      [[name, p.label] + [loadserve.ratio_text("", p.latency_ratios[k]).strip() for k in labels]
                       for name, p in served]))
