"""The analysis data model: one experiment, its arms, its runs and what each run recorded.

Everything in the analysis (stats, spec model, doctor, report) works on these dataclasses, never
on files or SQL directly. Loaders fill them from a run directory tree (`runs/<experiment-id>/`,
see docs/architecture.md) or from the results store.
"""
from __future__ import annotations

import gc
import json
import math
import re
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from specab.analysis.evidence import logparse
from specab.config.spec import DETERMINISTIC_OF
from specab.results.store import Store, StoreError, gpu_csv_rows, store_file
from specab.vocab import contract, engines

# Throttle / clock-event reason bits (nvml.h nvmlClocksEventReason*).
CLOCK_REASONS = {
    0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
    0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting",
}
REASON_IDLE = 0x1


class AnalysisError(ValueError):
    """Data the analysis cannot use; the message names the file or run and what to do."""


def reason_names(mask: int) -> list[str]:
    names = [n for bit, n in CLOCK_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_REASONS)
    if rest:
        names.append(f"0x{rest:x}")
    return names


# --------------------------------------------------------------------------- per-request records

@dataclass
class Request:
    """One line of bench.jsonl (contract in docs/architecture.md)."""
    i: int
    warmup: bool = False
    ok: bool = True
    error: str | None = None
    start_ts: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    decode_tok_s: float | None = None
    tpot_s: float | None = None
    spec_verify_ct: int | None = None
    accept_len: float | None = None
    category: str | None = None           # the dataset record's category (None: synthetic or uncategorised)
    finish_reason: str | None = None      # the engine's: stop (the model's own end) or length (output_len reached)
    arrival_s: float | None = None        # open load: its scheduled arrival, seconds from the measurement's start
    arrival_wait_s: float | None = None   # open load: from that arrival to its send (a free slot of the client)
    buffered: bool | None = None          # its tokens reached the client in a burst (no decode pace: node/loadgen)

    @classmethod
    def from_json(cls, d: dict) -> "Request":
        known = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        known.setdefault("i", 0)
        return cls(**known)


# --------------------------------------------------------------------------- server log summary

@dataclass
class LogStats:
    """What the analysis needs from a run's server log (filled from specab.analysis.evidence.logparse)."""
    cuda_graph_true: int = 0
    cuda_graph_false: int = 0
    accept_len_mean: float | None = None      # mean of the decode lines' `accept len`
    gen_tok_s_median: float | None = None     # median `gen throughput (token/s)` of lines with running requests
    # median of `gen throughput` / `#running-req` over lines with running requests (an integer count): what
    # one request decoded at by the server's account
    gen_tok_s_per_req_median: float | None = None
    no_graph_example: str | None = None       # one decode line with `cuda graph: False`, quoted as evidence
    nccl_env: dict[str, str] = field(default_factory=dict)   # `NCCL INFO <VAR> set by environment to <v>`
    # the most requests the server ran at once and held in its queue, by its own account: SGLang's decode lines
    # (`#running-req`, `#queue-req`), vLLM's stats lines (`Running: N reqs, Waiting: M reqs`); None: no such line
    running_max: int | None = None
    queued_max: int | None = None

    @property
    def cuda_graph_share(self) -> float | None:
        n = self.cuda_graph_true + self.cuda_graph_false
        return self.cuda_graph_true / n if n else None


# --------------------------------------------------------------------------- env verification

@dataclass
class EnvVarCheck:
    name: str
    expected: str | None
    confirmed: bool                                         # seen with the expected value in every worker
    evidence: list[str] = field(default_factory=list)      # e.g. "/proc/123/environ (sglang::scheduler_TP0)"
    mismatches: list[str] = field(default_factory=list)    # "process: actual value"


@dataclass
class EnvCheck:
    variables: list[EnvVarCheck] = field(default_factory=list)

    def unconfirmed(self) -> list[EnvVarCheck]:
        return [v for v in self.variables if not v.confirmed]


# --------------------------------------------------------------------------- GPU samples

@dataclass(slots=True)       # ~330,000 of them in a 1,000-run experiment: no per-instance __dict__
class GpuSample:
    ts: float
    index: int
    uuid: str | None = None
    sm_mhz: float | None = None
    max_sm_mhz: float | None = None
    util_pct: float | None = None
    reasons: int | None = None          # clocks_event_reasons.active bitmask
    host: str | None = None             # the host that sampled it (a multi-node server's ranks); None: the run's


# --------------------------------------------------------------------------- runs, arms, experiment

@dataclass
class Rank:
    """Another rank of a multi-node server (rank 0, the head, serves and is benchmarked: its files are the
    run's own): what its host verified and recorded. (A run that every host of the inventory runs on its
    own lists the other hosts here the same way, with no rank.)"""
    host: str
    rank: int | None = None
    env_check: EnvCheck | None = None
    manifest: dict = field(default_factory=dict)


@dataclass
class Run:
    run_id: str
    arm: str
    seq: int = 0
    block: int = 0
    host: str = "localhost"
    status: str = "ok"                       # ok | failed | running
    started: float | None = None             # unix s
    finished: float | None = None
    server_args: dict[str, Any] = field(default_factory=dict)   # effective (server_info) or intended
    env: dict[str, str] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    log: LogStats | None = None
    env_check: EnvCheck | None = None
    gpu_samples: list[GpuSample] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)
    client_cpu_s: float | None = None       # every client process's CPU over the measured requests
    # the busiest client process's (a summary from before the client had processes: its one process's, client_cpu_s)
    client_cpu_max_proc_s: float | None = None
    client_procs: int = 1                    # processes the client's slots were divided among
    duration_s: float | None = None
    run_dir: Path | None = None
    error: str | None = None
    time_scale: float = 1.0                  # simulated node: times were divided by this (already undone)
    ranks: list[Rank] = field(default_factory=list)   # a multi-node server's other ranks, by rank
    gpu_seconds: float | None = None         # what the run cost (store runs.gpu_seconds; None in older stores)
    phase_metrics: dict | None = None        # phase_metrics.json: /metrics deltas over the measured window
    engine_accept_len: float | None = None   # the engine's own count over the measured requests (vLLM: /metrics
                                             # deltas, bench_summary spec_metrics): when responses carry none
    buffered_requests: int = 0               # measured requests delivered in bursts (node/loadgen: no decode pace)
    engine_tok_s: float | None = None        # the engine's own decode rate over the measured requests (vLLM's
                                             # /metrics histograms, bench_summary engine_decode): tok/s where the
                                             # client could time no request (tok_s_source "engine")
    known_truth: dict | None = None          # bench_summary's known_truth: the served models' (specab.knowntruth)
    known_truth_problems: list[str] = field(default_factory=list)   # what kept the client from it, each naming a file
    workload: dict | None = None             # bench_summary's dataset (kind synthetic, or file with path, sha256,
                                             # records, categories) and ignore_eos; None: not recorded
    # bench_summary's latency percentiles over the measured requests, seconds (simulated seconds on a time-scaled
    # node): {"ttft_s"|"tpot_s"|"e2e_s"|"itl_s": {"p50", "p90", "p99"}}; None: a client that did not record them
    latency: dict | None = None
    spec_positions: dict | None = None       # bench_summary's spec_positions: cycles and the cycles that accepted
                                             # each draft position (analysis/measures/positions.py); None: not measured
    # the run whose server start this run measured on (store runs.server_seq): another run's where it continued its
    # instance's server (docs/decisions/0011); None: its own (a store before the column, or the run itself)
    server_seq: int | None = None

    @property
    def instance(self) -> int:
        """The server instance the run measured on: the seq of the run that started it (its own seq where it started
        its own). Runs of one instance share its instance effect (docs/statistics.md)."""
        return self.seq if self.server_seq is None else self.server_seq

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.measured)

    @property
    def measured(self) -> list[Request]:
        return [r for r in self.requests if not r.warmup and r.ok]

    @property
    def tok_s(self) -> float | None:
        """The run's output tok/s: median over its measured requests' decode tok/s. A run none of whose requests
        the client could time (all reached it in bursts) has the engine's own decode rate over the same requests,
        where the engine reports one (``tok_s_source``), as accept_len has the engine's count."""
        # statistics.median's arithmetic, inline: the doctor asks ~260,000 times in a 1,000-run experiment
        v = sorted([r.decode_tok_s for r in self.requests if not r.warmup and r.ok and r.decode_tok_s])
        n = len(v)
        if not n:
            return self.engine_tok_s if self.measured else None
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    @property
    def tok_s_source(self) -> str | None:
        """Where tok_s comes from: "client" (the requests' own decode rates), "engine" (engine_tok_s), None."""
        if any(not r.warmup and r.ok and r.decode_tok_s for r in self.requests):
            return "client"
        return "engine" if self.measured and self.engine_tok_s else None

    @property
    def accept_len(self) -> float | None:
        """Run-scoped accept length from the requests: sum(completion tokens) / sum(verify steps)."""
        reqs = [r for r in self.measured if r.spec_verify_ct]
        if reqs and all(r.output_tokens for r in reqs):
            return sum(r.output_tokens for r in reqs) / sum(r.spec_verify_ct for r in reqs)  # type: ignore[misc]
        v = [r.accept_len for r in self.measured if r.accept_len]
        return statistics.fmean(v) if v else self.engine_accept_len

    @property
    def throughput(self) -> float | None:
        """Total output tok/s of the run: every measured request's output tokens over the measured window (first
        request sent to last one finished), in the same time base as tok/s (a simulated node's scale undone). At
        one request in flight it is about the per-request rate; with N in flight, the server's total output."""
        w = self.window
        tokens = sum(r.output_tokens or 0 for r in self.measured)
        if not w or w[1] <= w[0] or not tokens:
            return None
        return tokens / ((w[1] - w[0]) * (self.time_scale or 1.0))

    @property
    def window(self) -> tuple[float, float] | None:
        """Measured window in wall-clock epoch seconds (first measured request sent .. last one finished).

        start_ts is wall clock while e2e_s was converted to simulated seconds on a time-scaled
        simulated node (_unscale_request), so it is divided back by the scale here."""
        rs = [r for r in self.measured if r.start_ts is not None]
        if not rs:
            return None
        scale = self.time_scale or 1.0
        return (min(r.start_ts for r in rs),  # type: ignore[type-var]
                max(r.start_ts + (r.e2e_s or 0.0) / scale for r in rs))  # type: ignore[operator]

    @property
    def midpoint(self) -> float | None:
        w = self.window
        if w:
            return (w[0] + w[1]) / 2
        if self.started is not None:
            return self.started if self.finished is None else (self.started + self.finished) / 2
        return None


def bench_of(config: Any) -> dict[str, Any] | None:
    """The ``bench`` section of a stored experiment config, None where it has none readable."""
    bench = config.get("bench") if isinstance(config, dict) else None
    return bench if isinstance(bench, dict) else None


def bench_concurrency(config: Any) -> int:
    """Requests in flight of an experiment's benchmark (``bench.concurrency`` of its config; the roles' default
    when unset, 1 when the config says nothing readable)."""
    from specab.config import defaults
    bench = bench_of(config)
    try:
        value = bench.get("concurrency", defaults.get("bench_concurrency")) if bench is not None else 1
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def arm_concurrency(exp: "Experiment", arm: str) -> int:
    """Requests in flight of an arm's runs: its matrix's ``concurrency`` (a bench condition of the matrix), else the
    experiment's ``bench.concurrency``."""
    try:
        value = exp.arm(arm).matrix.get("concurrency")
    except AnalysisError:
        value = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return bench_concurrency(exp.meta.get("config") if isinstance(exp.meta, dict) else None)


def arm_rate(exp: "Experiment", arm: str) -> float:
    """Measured requests per second of an arm's runs at seeded arrival times: its matrix's ``request_rate``, else
    the experiment's ``bench.request_rate``; 0 for a closed loop (each request as soon as one in flight ends)."""
    try:
        value = exp.arm(arm).matrix.get("request_rate")
    except AnalysisError:
        value = None
    if value is None:
        bench = bench_of(exp.meta.get("config") if isinstance(exp.meta, dict) else None)
        value = bench.get("request_rate") if bench is not None else None
    try:
        rate = float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return rate if rate > 0 and math.isfinite(rate) else 0.0


def load_label(concurrency: int, rate: float = 0.0) -> str:
    """How a load is named: "single-stream" only at one request in flight and no arrival schedule; a rate with the
    cap of requests in flight it ran under."""
    if rate > 0:
        return f"{rate:g} req/s (at most {concurrency} in flight)"
    return "1 in flight (single-stream)" if concurrency <= 1 else f"{concurrency} in flight"


def tok_s_meaning(concurrency: int) -> str:
    """What a run's tok/s (the median of its requests' decode rates) is at this many requests in flight: one
    request's speed, which is the single-stream speed only when nothing else shares the batch."""
    if concurrency <= 1:
        return "single-stream decode speed"
    return f"per-request (per-user) decode speed with {concurrency} requests in flight, not total throughput"


@dataclass
class Arm:
    name: str
    server_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None     # the baseline arm this arm is compared with (None: the experiment's)
    matrix: dict[str, Any] = field(default_factory=dict)

    @property
    def is_spec(self) -> bool:
        return engines.speculative_view(self.server_args).algorithm is not None

    @property
    def steps(self) -> int | None:
        """Drafted tokens per cycle (SGLang speculative_num_steps, vLLM num_speculative_tokens): the spec model's k."""
        return engines.speculative_view(self.server_args).steps


@dataclass
class Experiment:
    id: str
    arms: list[Arm]
    runs: list[Run]
    order: str = "interleaved"             # interleaved | blocked
    baseline: str = "baseline"
    name: str = ""
    root: Path | None = None
    target_ci: float | None = None         # relative half-width, 0.02 = 2 %
    max_repeats: int | None = None
    meta: dict = field(default_factory=dict)
    # the unmeasured starts before block 1 (design.burn_in, the store's plan.burn_in): kept apart from `runs`, so
    # no statistic, rule or cost model sees them as measured instances; the report shows how fast they ran
    burn_in: list[Run] = field(default_factory=list)
    # the deterministic pass (--correctness): its arms (matrix value deterministic_of) and runs, kept apart from
    # `arms` and `runs` so no statistic, rule or verdict sees them as measured; its own arms compared within it
    deterministic: "Experiment | None" = None

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise AnalysisError(f"experiment {self.id} has no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def runs_of(self, arm: str, ok_only: bool = True) -> list[Run]:
        return [r for r in self.runs if r.arm == arm and (r.ok or not ok_only)]

    def baseline_of(self, arm: str) -> str:
        a = self.arm(arm)
        return a.baseline or self.baseline

    @property
    def baselines(self) -> list[str]:
        names = {self.baseline} | {a.baseline for a in self.arms if a.baseline}
        return [a.name for a in self.arms if a.name in names]

    @property
    def spec_arms(self) -> list[Arm]:
        """Arms compared with a baseline (every arm that is not itself a baseline)."""
        base = set(self.baselines)
        return [a for a in self.arms if a.name not in base]

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.runs})

    def stores_of(self, runs: Iterable[Run]) -> tuple[dict[Path, list[tuple[int, int]]], list[Run]]:
        """Where each run's request rows are: per store file, (seq here, seq there) of its runs (a pooled
        experiment's come from several stores, under the seq each had there, ``meta["sources"]``), and the runs
        whose store is not there (a run-directory round, or a pooled store that is gone)."""
        sources = self.meta.get("sources") or {}
        own = self.root / "results.sqlite" if self.root is not None else None
        groups: dict[Path, list[tuple[int, int]]] = {}
        gone = []
        for r in runs:
            path, seq = sources.get(r.seq, (own, r.seq))
            if path is None or not Path(path).is_file():
                gone.append(r)
            else:
                groups.setdefault(Path(path), []).append((r.seq, seq))
        return groups, gone


# =========================================================================== loaders

def read_bench_jsonl(path: Path) -> list[Request]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(Request.from_json(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise AnalysisError(f"{path}:{n}: not a bench.jsonl record ({e}); "
                                    "a partially written last line means the run was interrupted") from e
    return out


def bench_records(path: Path) -> list[dict[str, Any]] | None:
    """Every record of a bench.jsonl as it stands (a line cut short by an interrupt or a crash is passed over); None
    where the file cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# a number from a CSV cell or a JSON value: empty, N/A-like and non-numbers are None, units as nvidia-smi writes them
# stripped
_num = contract.smi_number


def _int(v: Any) -> int | None:
    """A whole-number column (None: absent, or NULL in the store)."""
    return None if v is None or isinstance(v, bool) else int(v)


def read_gpu_samples(path: Path) -> list[GpuSample]:
    """GPU samples CSV with a header row (nvidia-smi query names, units in brackets tolerated), read as the results
    store reads it (store.gpu_csv_rows)."""
    header, columns, rows = gpu_csv_rows(Path(path).read_text(encoding="utf-8"))
    if not header:
        return []
    if "ts" not in columns or "gpu" not in columns:
        raise AnalysisError(f"{path}: GPU samples need a timestamp and an index column (header: {header})")
    return [GpuSample(ts=v["ts"], index=int(v["gpu"] or 0), uuid=v.get("uuid"), sm_mhz=v.get("sm_clock_mhz"),
                      max_sm_mhz=v.get("max_sm_clock_mhz"), util_pct=v.get("util_pct"),
                      reasons=_reasons(v.get("throttle_reasons")))
            for v, _raw in rows if v["ts"] is not None]


def env_check_from_json(d: dict) -> EnvCheck:
    """env_check.json (specab/node/envcheck.py) -> EnvCheck.

    Format: {"ok", "variables": {VAR: {"expected", "evidence": [...], "mismatches": [...],
    "unverified": [...]}}, "args": {ARG: {"expected", "actual", "ok"}}, ...}. A variable is confirmed
    when it has evidence and neither mismatches nor unverified processes."""
    vars_in = d.get("variables") or {}
    items = vars_in.items() if isinstance(vars_in, dict) else ((v.get("name", "?"), v) for v in vars_in)
    checks = []
    for name, v in items:
        if not isinstance(v, dict):
            continue
        evidence = v.get("evidence") or []
        evidence = [evidence] if isinstance(evidence, str) else [str(e) for e in evidence]
        problems = [str(m) for m in (v.get("mismatches") or [])] + [str(m) for m in (v.get("unverified") or [])]
        confirmed = v.get("confirmed")
        if confirmed is None:
            confirmed = bool(evidence) and not problems
        checks.append(EnvVarCheck(name=name, expected=v.get("expected"), confirmed=bool(confirmed),
                                  evidence=evidence, mismatches=problems))
    return EnvCheck(variables=checks)


def _count_load(st: LogStats, r: dict) -> None:
    """The running and queued requests of one decode or vLLM stats record, into the log's maxima."""
    running, queued = ((r.get("running_req"), r.get("queue_req")) if r.get("kind") == "decode"
                       else (r.get("running"), r.get("waiting")) if r.get("kind") == "vllm_stats" else (None, None))
    if isinstance(running, int) and not isinstance(running, bool):
        st.running_max = max(st.running_max or 0, running)
    if isinstance(queued, int) and not isinstance(queued, bool):
        st.queued_max = max(st.queued_max or 0, queued)


def log_stats_from_records(records: Iterable[dict], nccl: dict[str, str] | None = None) -> LogStats:
    """LogStats from parsed log records: dicts with kind 'decode' and keys accept_len, cuda_graph,
    gen_throughput, running_req, raw (the shape specab.analysis.evidence.logparse emits)."""
    st = LogStats(nccl_env=dict(nccl or {}))
    acc, gen, per_req = [], [], []
    for r in records:
        _count_load(st, r)
        if r.get("kind") != "decode":
            continue
        cg = r.get("cuda_graph")
        if cg is True:
            st.cuda_graph_true += 1
        elif cg is False:
            st.cuda_graph_false += 1
            if st.no_graph_example is None:
                st.no_graph_example = r.get("raw")
        if r.get("accept_len") is not None:
            acc.append(float(r["accept_len"]))
        if r.get("gen_throughput") is not None and (r.get("running_req") or 0) > 0:
            gen.append(float(r["gen_throughput"]))
            if isinstance(r["running_req"], int):
                per_req.append(float(r["gen_throughput"]) / r["running_req"])
    st.accept_len_mean = statistics.fmean(acc) if acc else None
    st.gen_tok_s_median = statistics.median(gen) if gen else None
    st.gen_tok_s_per_req_median = statistics.median(per_req) if per_req else None
    return st


def parse_server_log(path: Path) -> LogStats:
    """Server log -> LogStats through specab.analysis.evidence.logparse (the project's one log parser); streams.

    Reads only the decode and NCCL-env lines (`logparse.run_log_records`: the per-line parser's records
    for those lines), which is what LogStats summarises."""
    nccl: dict[str, str] = {}

    def decode_records() -> Iterator[dict]:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for rec in logparse.run_log_records(fh):
                if rec["kind"] == "nccl_env":
                    nccl.setdefault(rec["var"], str(rec["value"]).rstrip("."))
                else:
                    yield rec           # decode and vLLM stats records

    st = log_stats_from_records(decode_records())
    st.nccl_env = nccl
    return st


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{path}: not valid JSON ({e})") from e


def load_run_dir(run_dir: Path, *, arm: str | None = None, seq: int | None = None, block: int = 0) -> Run:
    """One `runs/<experiment>/<seq>-<arm>/` directory -> Run (missing files leave fields empty). A simulated
    node's time-scaled times are converted back to simulated seconds, as `load_store` does, so a run reads the
    same from its directory as from the store."""
    run_dir = Path(run_dir)
    m = re.match(r"^(\d+)-(.+)$", run_dir.name)
    if arm is None or seq is None:
        if not m:
            raise AnalysisError(f"{run_dir}: a run directory is named <seq>-<arm> (e.g. 001-baseline)")
        seq = int(m.group(1)) if seq is None else seq
        arm = m.group(2) if arm is None else arm
    manifest = _read_json(run_dir / "manifest.json")
    info = _read_json(run_dir / "server_info.json")
    summary = _read_json(run_dir / "bench_summary.json")
    requests = read_bench_jsonl(run_dir / "bench.jsonl") if (run_dir / "bench.jsonl").exists() else []
    server_args = {k: v for k, v in info.items() if k not in ("internal_states", "version")} if info else {}
    if not server_args:
        server_args = dict(manifest.get("server_args") or manifest.get("engine_args") or {})
    env = dict(manifest.get("env") or {})
    log = parse_server_log(run_dir / "server.log") if (run_dir / "server.log").exists() else None
    ec = _read_json(run_dir / "env_check.json")
    samples = read_gpu_samples(run_dir / "gpu_samples.csv") if (run_dir / "gpu_samples.csv").exists() else []
    scale = _time_scale(info)
    _unscale_run(requests, log, scale)
    starts = [r.start_ts for r in requests if r.start_ts is not None]
    ts = manifest.get("timestamps", {}) if isinstance(manifest.get("timestamps"), dict) else {}
    return Run(run_id=run_dir.name, arm=arm, seq=seq, block=block,
               host=manifest["host"] if isinstance(manifest.get("host"), str) else "localhost",
               status="ok" if requests and all(r.ok for r in requests if not r.warmup) else "failed",
               started=_num(ts.get("started")) or (min(starts) if starts else None),
               finished=_num(ts.get("finished")),
               server_args=server_args, env=env, requests=requests, log=log,
               env_check=env_check_from_json(ec) if ec else None, gpu_samples=samples, manifest=manifest,
               client_cpu_s=_num(summary.get("client_cpu_s")), duration_s=_num(summary.get("duration_s")),
               client_cpu_max_proc_s=_client_cpu_max_proc_s(summary), client_procs=_client_procs(summary),
               run_dir=run_dir, phase_metrics=_read_json(run_dir / "phase_metrics.json") or None,
               engine_accept_len=_engine_accept_len(summary), engine_tok_s=_engine_tok_s(summary, scale),
               buffered_requests=int(summary.get("buffered_requests") or 0), time_scale=scale,
               workload=_workload(summary), latency=_latency(summary, scale),
               spec_positions=_spec_positions(summary))


def _client_cpu_max_proc_s(summary: dict) -> float | None:
    """The busiest client process's CPU seconds; a summary written before the client had processes ran one, whose
    CPU is client_cpu_s."""
    busiest = _num(summary.get("client_cpu_max_proc_s"))
    return busiest if busiest is not None else _num(summary.get("client_cpu_s"))


def _client_procs(summary: dict) -> int:
    n = summary.get("client_procs")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def _workload(summary: dict) -> dict | None:
    """Where the run's prompts came from, whether answers ran past the model's end and how they were sampled
    (temperature, top_p; absent: greedy, a client from before they were settings), as the benchmark client recorded
    them in bench_summary.json (node/loadgen), or None for a summary without them (an older client)."""
    data = summary.get("dataset")
    if not isinstance(data, dict):
        return None
    return dict(data, ignore_eos=summary.get("ignore_eos"), temperature=summary.get("temperature", 0.0),
                top_p=summary.get("top_p", 1.0))


def _latency(summary: dict, scale: float) -> dict | None:
    """bench_summary's latency percentiles (node/loadgen `latency`), in simulated seconds on a time-scaled node."""
    lat = summary.get("latency")
    if not isinstance(lat, dict):
        return None
    return {k: {q: (_num(x) * scale if _num(x) is not None else None) for q, x in v.items()}   # type: ignore[operator]
            for k, v in lat.items() if isinstance(v, dict)}


def _spec_positions(summary: dict) -> dict | None:
    """The run's per-position acceptance counts as the benchmark client recorded them (node/loadgen spec_positions:
    from the requests' own counts or the engine's counters over the measured window), or None."""
    pos = summary.get("spec_positions")
    return pos if isinstance(pos, dict) else None


def _engine_accept_len(summary: dict) -> float | None:
    """A run's acceptance length as the engine counted it over the measured requests (vLLM's /metrics delta,
    node/loadgen.add_engine_acceptance), or None."""
    spec = summary.get("spec_metrics")
    return _num(spec.get("accept_len")) if isinstance(spec, dict) else None


def _engine_tok_s(summary: dict, scale: float = 1.0) -> float | None:
    """The engine's own decode rate over the measured requests (vLLM's /metrics histograms, node/loadgen
    `engine_decode`), in the requests' time base (a simulated node's scale undone), or None."""
    dec = summary.get("engine_decode")
    rate = _num(dec.get("decode_tok_s")) if isinstance(dec, dict) else None
    return None if rate is None else rate / scale


# =========================================================================== the results store

def _reasons(v: Any) -> int | None:
    if v is None or v == "":
        return None
    try:
        s = str(v).strip()
        return int(s, 16) if s.lower().startswith("0x") else int(float(s))
    except ValueError:
        return None


def _argv_option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _percent(s: str | None) -> float | None:
    if not s:
        return None
    try:
        return float(s[:-1]) / 100.0 if s.endswith("%") else (float(s) / 100.0 if float(s) >= 1 else float(s))
    except ValueError:
        return None


def _time_scale(server_info: Any) -> float:
    """SPECAB_SIM_TIME_SCALE of a simulated node, from /get_server_info's `simulator` block (1 otherwise)."""
    sim = server_info.get("simulator") if isinstance(server_info, dict) else None
    try:
        v = float(sim.get("time_scale", 1.0)) if isinstance(sim, dict) else 1.0
    except (TypeError, ValueError):
        return 1.0
    return v if v > 0 else 1.0


def _unscale_request(q: Request, scale: float) -> None:
    """A simulated node at time scale s runs s times faster: convert back to simulated seconds."""
    for k in ("ttft_s", "e2e_s", "tpot_s", "arrival_s", "arrival_wait_s"):
        v = getattr(q, k)
        if v is not None:
            setattr(q, k, v * scale)
    if q.decode_tok_s is not None:
        q.decode_tok_s /= scale


def _unscale_run(requests: Iterable[Request], log: LogStats | None, scale: float) -> None:
    """A run of a simulated node at time scale `scale`: its requests and log rates in simulated seconds."""
    if scale == 1.0:
        return
    for q in requests:
        _unscale_request(q, scale)
    if log and log.gen_tok_s_median:
        log.gen_tok_s_median /= scale
    if log and log.gen_tok_s_per_req_median:
        log.gen_tok_s_per_req_median /= scale


def _store_requests(store: Any) -> dict[int, list[Request]]:
    """Every request record of the store (warm-ups included) by seq, without the per-chunk arrays."""
    names = Request.__dataclass_fields__.keys()
    cols = store.REQUEST_ROW[1:]
    pos = [cols.index(n) for n in names]
    flags = {cols.index("warmup"), cols.index("ok")}
    out: dict[int, list[Request]] = {}
    for row in store.request_rows():
        vals = row[1:]
        out.setdefault(row[0], []).append(Request(*[bool(vals[i]) if i in flags else vals[i] for i in pos]))
    return out


def _store_gpu_samples(store: Any) -> dict[int, list[GpuSample]]:
    """Every GPU sample with a timestamp by seq. Repeated UUID strings and reason masks share one object
    (sharing the floats too would save ~45 MB of a 1,000-run experiment's ~330,000 samples, at 0.3 s)."""
    same: dict[Any, Any] = {}
    reasons: dict[Any, int | None] = {}
    out: dict[int, list[GpuSample]] = {}
    cur_seq, cur = None, None
    unsorted: set[int] = set()
    last_ts = 0.0
    for seq, ts, gpu, sm, max_sm, _mem, util, _power, _temp, thr, host, uuid in store.gpu_sample_rows():
        if seq != cur_seq:
            cur_seq, cur = seq, out.setdefault(seq, [])
        elif ts < last_ts:
            unsorted.add(seq)
        last_ts = ts
        try:
            r = reasons[thr]
        except KeyError:
            r = reasons[thr] = _reasons(thr)
        cur.append(GpuSample(ts, int(gpu or 0), uuid and same.setdefault(uuid, uuid), sm, max_sm, util, r,
                             host and same.setdefault(host, host)))
    for seq in unsorted:       # by time; a stable sort keeps the insertion order of equal times
        out[seq].sort(key=lambda s: s.ts)
    return out


def _head_and_ranks(row: dict, manifests: dict[str, dict], checks: dict[str, dict]
                    ) -> tuple[dict | None, dict | None, list[Rank]]:
    """The run's own manifest and env check (its host's; a multi-node run's row names every host, the head
    first) and its other ranks' (sorted by the node_rank their manifest records)."""
    hosts = [h for h in str(row.get("host") or "").split(",") if h]
    known = list(manifests) + [h for h in checks if h not in manifests]
    head = hosts[0] if hosts and (hosts[0] in manifests or hosts[0] in checks) else (known[0] if known else None)
    ranks = []
    for h in known:
        if h == head:
            continue
        m = manifests.get(h) or {}
        extra = m.get("extra")
        rank = extra.get("node_rank") if isinstance(extra, dict) else None
        ranks.append(Rank(host=h, rank=int(rank) if str(rank).isdigit() else None,
                          env_check=env_check_from_json(checks[h]) if h in checks else None, manifest=m))
    ranks.sort(key=lambda k: (k.rank is None, k.rank or 0, hosts.index(k.host) if k.host in hosts else 0))
    return manifests.get(head) if head else None, checks.get(head) if head else None, ranks


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a block, restoring its state after. Building the
    ~350,000 objects of a 1,000-run experiment (none in a reference cycle) otherwise triggers a collection
    every 700 allocations, each older generation traversing everything built so far: ~0.3 s of a load,
    ~0.7 s of a report. Reference counting still frees everything as usual meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_store(path: str | Path, *, read_logs: bool = True) -> Experiment:
    """An experiment from its results store (`runs/<id>/results.sqlite`, docs/results.md).

    path: the experiment directory or the sqlite file. Server logs are read from the run
    directories when they exist (the store keeps only their tail)."""
    with gc_paused():
        return _load_store(path, read_logs=read_logs)


def _store_rows(p: Path) -> tuple[Any, ...]:
    """Everything the loader reads of a store, in one open: the experiment, arms, runs, run fingerprints, requests
    and GPU samples by seq, manifests and env checks by seq and host, phase metrics, design steps."""
    store = Store.open(p)
    try:
        manifests: dict[int, dict[str, dict]] = {}
        for m in store.manifests():
            manifests.setdefault(m["seq"], {})[m["host"]] = m["manifest"]
        checks: dict[int, dict[str, dict]] = {}
        for c in store.env_checks():
            checks.setdefault(c["seq"], {})[c["host"]] = c["check"]
        return (store.experiment(), store.arms(), store.runs(), store.run_fingerprints(), _store_requests(store),
                _store_gpu_samples(store), manifests, checks, store.phase_metrics(), store.design_steps())
    finally:
        store.close()


def _load_store(path: str | Path, *, read_logs: bool) -> Experiment:
    try:
        p = store_file(path)
    except StoreError as exc:       # the analysis's own error, which its callers catch
        raise AnalysisError(str(exc)) from None
    e, arm_rows, run_rows, run_fps, reqs, samples, manifests, checks, phase_files, design_steps = _store_rows(p)
    arms = [Arm(name=a["name"], server_args=a.get("server_args") or {}, env=a.get("env") or {},
                baseline=a.get("baseline"), matrix=a.get("matrix") or {}) for a in arm_rows]
    base_rows = [a for a in arm_rows if a.get("is_baseline")]
    baseline = base_rows[0]["name"] if base_rows else (arms[0].name if arms else "baseline")
    by_arm = {a.name: a for a in arms}
    runs, burn_in = [], []
    for r in run_rows:
        arm = by_arm.get(r["arm"])
        info = r.get("server_info") or {}
        eff = {k: v for k, v in info.items() if k not in ("internal_states", "version")} if isinstance(info, dict) else {}
        summary = r.get("summary") or {}
        run_dir = Path(r["run_dir"]) if r.get("run_dir") else None
        log = None
        if read_logs and run_dir and (run_dir / "server.log").is_file():
            log = parse_server_log(run_dir / "server.log")
        if run_dir and not samples.get(r["seq"]) and (run_dir / "gpu_samples.csv").is_file():
            samples[r["seq"]] = read_gpu_samples(run_dir / "gpu_samples.csv")
        manifest, check, ranks = _head_and_ranks(r, manifests.get(r["seq"], {}), checks.get(r["seq"], {}))
        scale = _time_scale(info)
        _unscale_run(reqs.get(r["seq"], []), log, scale)
        (burn_in if r.get("burn_in") else runs).append(Run(
            time_scale=scale,
            run_id=r["run_id"], arm=r["arm"], seq=r["seq"], block=r["block"], host=r.get("host") or "localhost",
            status=r["status"], started=r.get("started"), finished=r.get("finished"),
            server_args=eff or dict(arm.server_args if arm else {}), env=dict(arm.env if arm else {}),
            requests=reqs.get(r["seq"], []), log=log,
            env_check=env_check_from_json(check) if check else None,
            gpu_samples=samples.get(r["seq"], []), manifest=manifest or {}, ranks=ranks,
            client_cpu_s=_num(summary.get("client_cpu_s")), duration_s=_num(summary.get("duration_s")),
            client_cpu_max_proc_s=_client_cpu_max_proc_s(summary), client_procs=_client_procs(summary),
            run_dir=run_dir, error=r.get("failure_reason"), gpu_seconds=_num(r.get("gpu_seconds")),
            engine_accept_len=_engine_accept_len(summary), engine_tok_s=_engine_tok_s(summary, scale),
            buffered_requests=int(summary.get("buffered_requests") or 0),
            phase_metrics=phase_files.get(r["seq"]), known_truth=summary.get("known_truth"),
            known_truth_problems=[str(p) for p in summary.get("known_truth_problems") or []],
            workload=_workload(summary), latency=_latency(summary, scale),
            spec_positions=_spec_positions(summary), server_seq=_int(r.get("server_seq"))))
    argv = e.get("argv") or []
    arms, runs, det = _deterministic_apart(e["id"], arms, runs, arm_rows)
    scales = sorted({r.time_scale for r in runs})
    exp = Experiment(id=e["id"], arms=arms, runs=runs, order=e.get("order_mode") or "interleaved",
                     baseline=baseline, name=e.get("name") or "", root=p.parent,
                     target_ci=_percent(_argv_option(argv, "--target-ci")),
                     max_repeats=int(_argv_option(argv, "--max-repeats") or 0) or None,
                     meta={**{k: e.get(k) for k in ("status", "seed", "repeats", "created", "finished",
                                                    "git_sha", "config", "hosts", "matrix")},
                           "time_scales": scales, "design_steps": design_steps, "argv": list(argv),
                           "run_fingerprints": {r["run_id"]: run_fps[r["seq"]] for r in run_rows
                                                if r["seq"] in run_fps and not r.get("burn_in")}},
                     burn_in=burn_in)
    if det is not None:
        det.meta, det.root = exp.meta, exp.root
    exp.deterministic = det
    return exp


def _deterministic_apart(exp_id: str, arms: list[Arm], runs: list[Run], arm_rows: list[dict]
                         ) -> tuple[list[Arm], list[Run], Experiment | None]:
    """The measured arms and runs, and the deterministic pass's (arms whose matrix names the arm they check,
    `deterministic_of`) as an experiment of its own, or None where the experiment has no pass."""
    det_names = {a.name for a in arms if a.matrix.get(DETERMINISTIC_OF)}
    if not det_names:
        return arms, runs, None
    base_rows = [a["name"] for a in arm_rows if a.get("is_baseline") and a["name"] in det_names]
    det = Experiment(id=exp_id, arms=[a for a in arms if a.name in det_names],
                     runs=[r for r in runs if r.arm in det_names],
                     baseline=base_rows[0] if base_rows else "baseline")
    return ([a for a in arms if a.name not in det_names], [r for r in runs if r.arm not in det_names], det)
