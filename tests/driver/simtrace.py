"""The simulated node's trace (``SPECAB_SIM_TRACE``: one JSON line per finished request) as the ground truth of a
run's measured requests: the times the simulator emitted each chunk (``emit_mono``) or the times its schedule had
them due (``emit_due``)."""
from __future__ import annotations

import json
from pathlib import Path

from specab.analysis.evidence.model import Request, Run


def trace_of(trace: Path, run: Run) -> list[tuple[Request, dict]]:
    """Each measured request of the run with the simulator's trace line of it (the one that arrived at its start)."""
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    out = []
    for q in run.measured:
        rec = min(recs, key=lambda x: abs(x["arrival_wall"] - (q.start_ts or 0.0)))
        assert abs(rec["arrival_wall"] - (q.start_ts or 0.0)) < 0.5 and rec["completion_tokens"] == q.output_tokens
        out.append((q, rec))
    return out


def true_decode_tok_s(trace: Path, run: Run, times: str = "emit_mono") -> float:
    """The median of the simulator's own decode rates over the run's measured requests: from the times it emitted
    the tokens (``emit_mono``), or from the times its schedule had them due (``emit_due``)."""
    rates = sorted((rec["completion_tokens"] - 1) / (rec[times][-1] - rec[times][0]) / rec["time_scale"]
                   for _, rec in trace_of(trace, run))
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def modelled_decode_tok_s(trace: Path, run: Run) -> float:
    """The median of the simulator's timing model's decode rates over the run's measured requests: each request's
    tokens after the first over the modelled seconds of the decode passes that served it (``pass_forward_s``, at
    scale 1), which neither a box slower than the schedule nor a restarted schedule moves. For a baseline request
    served alone that is its decode steps exactly; under speculation it leaves out the cycle's time outside the
    device-timer passes."""
    rates = sorted((rec["completion_tokens"] - 1) / (sum(rec["pass_forward_s"].values()) * rec["time_scale"])
                   for _, rec in trace_of(trace, run))
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def true_cycles_ms(trace: Path, run: Run, times: str = "emit_mono") -> float:
    """The simulator's own decode cycle over a run's measured requests (its trace: the times it emitted the
    tokens, or with ``emit_due`` the times its schedule had them due), defined as the analysis defines the implied
    cycle: sum of decode spans / sum of verify steps, in simulated ms. Each measured request is matched to the
    trace line that arrived at its start."""
    span = verify = 0.0
    for q, rec in trace_of(trace, run):
        assert rec["spec_verify_ct"] == q.spec_verify_ct            # the client read the engine's own count
        span += (rec[times][-1] - rec[times][0]) * rec["time_scale"]
        verify += rec["spec_verify_ct"]
    return 1000.0 * span / verify
