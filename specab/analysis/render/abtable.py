"""The results table of one A/B round of `playbooks/ab_test.yml`, computed as the driver's report computes it.

The round's run directories (one run per arm, all of one block) are read as one `Experiment`
(`model.load_run_dir`) and analysed by the code behind `driver.py report`: an arm's tok/s is the median over
its runs of each run's median measured decode tok/s, its TTFT the median of the runs' median TTFT, its accept
length the mean over its runs (`stats.arm_stats`); a speculative arm's speedup is the paired speedup against
its baseline in the same block (`stats.paired_speedup`); the line of why is the doctor's first finding
(`doctor.diagnose` orders the findings by severity). A rate that cannot be measured is shown as '-', never 0.

`playbooks/lookup_plugins/specab_ab_table.py` is the playbook's entry point.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from specab.analysis.measures import stats
from specab.analysis.findings import doctor
from specab.analysis.evidence.model import Arm, Experiment, Run, load_run_dir
from specab.analysis.measures import validity

HEADER = ("arm", "requests", "tok/s (median)", "TTFT (ms)", "accept len", "speedup", "outputs")
ROW_FORMAT = "%-16s %9s %14s %10s %11s %9s  %s"


@dataclass(frozen=True)
class RoundArm:
    """One arm of the round as ab_test.yml ran it: the resolved arm and where its run's files are."""
    name: str
    server_args: dict[str, Any]
    env: dict[str, Any]
    baseline: str           # the arm it is compared with; its own name for a baseline arm
    run_dir: Path


@dataclass(frozen=True)
class Row:
    """One arm's line of the table (and of ab_table.json)."""
    arm: str
    run_dir: str
    speculative: bool
    requests: int           # measured requests sent
    ok: int                 # measured requests that succeeded
    tok_s: float | None
    ttft_s: float | None
    accept_len: float | None
    speedup: float | None
    buffered: int           # measured requests that reached the client in bursts (no decode pace)
    engine_tok_s: float | None   # the engine's own decode rate (vLLM /metrics), where the engine reports one
    outputs: str = "-"           # a speculative arm's outputs against its baseline's: valid / NOT VALID / unchecked
    verdict: str = ""            # the arm's verdict with both parts, speed and validity (validity.verdict)


@dataclass(frozen=True)
class RoundTable:
    baseline: str
    rows: list[Row]
    why: str

    def lines(self, exp_dir: str | Path) -> list[str]:
        """The table as ab_test.yml prints it."""
        out = [ROW_FORMAT % HEADER]
        for r in self.rows:
            out.append(ROW_FORMAT % (r.arm, f"{r.ok}/{r.requests}", _fmt(r.tok_s, "{:.1f}"),
                                     _fmt(None if r.ttft_s is None else r.ttft_s * 1000, "{:.0f}"),
                                     _fmt(r.accept_len, "{:.2f}"), _fmt(r.speedup, "{:.2f}x"), r.outputs))
        out.append(f"speedup = tok/s / tok/s of arm {self.baseline} in this round (driver.py report's paired speedup); "
                   f"outputs = each request's output against the baseline's on the same prompt")
        out.extend(f"verdict: {r.arm}: {r.verdict}" for r in self.rows if r.verdict)
        out.append(f"why: {self.why}")
        out.append(f"artefacts in {exp_dir}")
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.rows]


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def round_experiment(experiment_id: str, arms: Sequence[RoundArm], config: dict[str, Any] | None = None
                     ) -> Experiment:
    """The round as one experiment of one block: arm i's run is its run directory, seq i + 1; ``config`` the
    experiment mapping (its validity rules, bench and the arms' cost_only)."""
    if not arms:
        raise ValueError("a round has at least one arm")
    baseline = next((a.baseline for a in arms if a.baseline == a.name), arms[0].name)
    model_arms = [Arm(name=a.name, server_args=dict(a.server_args), env={k: str(v) for k, v in a.env.items()},
                      baseline=a.baseline) for a in arms]
    runs = [load_run_dir(a.run_dir, arm=a.name, seq=i + 1, block=1) for i, a in enumerate(arms)]
    return Experiment(id=experiment_id, arms=model_arms, runs=runs, order="blocked", baseline=baseline,
                      root=arms[0].run_dir.parent, meta={"config": config} if config else {})


def _speedup(exp: Experiment, st: stats.ExperimentStats, arm: Arm) -> float | None:
    if arm.name in st.speedups:
        return st.speedups[arm.name].estimate
    # the experiment's baseline against itself; another baseline arm (a second arm that does not speculate)
    # is compared with nothing, as in the driver's report
    return 1.0 if arm.name == exp.baseline and st.arms[arm.name].tok_s_run.median else None


# where a doctor's message ends its first sentence: a full stop after a word, a number or a bracket, then a
# capital (so "e.g. the" and "0.5.23" stay whole)
SENTENCE_END = re.compile(r"(?<=[\w)\]%`])\. (?=[A-Z])")


def _why(findings: list[doctor.Finding]) -> str:
    """The doctor's top finding, its first sentence (what it found; `driver.py report` adds what to do)."""
    if not findings:
        return "the doctor found nothing to flag"
    top = findings[0]
    first = SENTENCE_END.split(" ".join(top.message.split()), maxsplit=1)[0].rstrip(".")
    return f"{first} (doctor: {top.severity}, {top.rule})"


def table(exp: Experiment) -> RoundTable:
    """The round's table: one row per arm, in the experiment's arm order."""
    st = stats.analyse(exp)
    val = validity.check(exp)
    findings = doctor.diagnose(exp, st, validity=val)
    rows = []
    for a in exp.arms:
        v = val.arms.get(a.name)
        sp = _speedup(exp, st, a)
        s = st.arms[a.name]
        run: Run | None = next(iter(exp.runs_of(a.name, ok_only=False)), None)
        measured = [q for q in run.requests if not q.warmup] if run else []
        rows.append(Row(arm=a.name, run_dir=str(run.run_dir) if run and run.run_dir else "", speculative=a.is_spec,
                        requests=len(measured), ok=len(run.measured) if run else 0, tok_s=s.tok_s_run.median,
                        ttft_s=s.ttft_s.median, accept_len=s.accept_len.mean, speedup=sp,
                        buffered=run.buffered_requests if run else 0,
                        engine_tok_s=run.engine_tok_s if run else None,
                        outputs=validity.cell(v),
                        verdict="" if v is None else validity.verdict(_fmt(sp, "{:.2f}x"), v)))
    return RoundTable(baseline=exp.baseline, rows=rows, why=_why(findings))
