"""Doctor: rules that turn an experiment's evidence into sentences a user can act on.

Each rule is a function `(exp, ctx) -> list[Finding]`; every finding quotes its evidence (log line,
env check, server args, GPU sample, numbers). Rules never raise on missing data: a rule without
its evidence stays silent.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from specab.analysis.cost import economics
from specab.analysis.cost import instances
from specab.analysis.measures import phases as phase_analysis
from specab.analysis.measures import specmodel
from specab.analysis.measures import truthcheck
from specab.analysis.measures import workload
from specab.analysis.evidence.model import REASON_IDLE, Experiment, GpuSample, Run, arm_concurrency, reason_names
from specab.analysis.measures.stats import ExperimentStats, analyse
from specab.analysis.measures import validity as validity_analysis
from specab.analysis.measures import concurrency
from specab.vocab import contract, engines
# scipy is imported in the functions that use it: importing scipy.stats takes ~1.3 s, which every start of
# driver.py paid (status, --help, a run before its first report: 1.8 s -> 0.55 s for --help).

SEVERITIES = ("error", "warning", "info")

# The seed's tuned NCCL variables (the seed's measurements).
TUNED_NCCL = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NTHREADS")

# Server args that must be equal across arms for a like-for-like A/B.
LIKE_FOR_LIKE = ("max_running_requests", "disable_overlap_schedule", "disable_cuda_graph", "cuda_graph_max_bs",
                 "cuda_graph_bs", "tp_size", "mem_fraction_static", "disable_custom_all_reduce", "attention_backend")


@dataclass
class Finding:
    rule: str
    severity: str
    message: str
    evidence: list[str] = field(default_factory=list)
    arm: str | None = None
    runs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DoctorConfig:
    usual_baseline_tok_s: float | None = None   # what this node's baseline normally reaches
    slower_than_usual: float = 0.10             # relative shortfall that counts as slower
    tuned_nccl: tuple[str, ...] = TUNED_NCCL
    graph_share_min: float = 0.5                # spec arm: below this share of graph decode lines -> fire
    clock_drop: float = 0.10                    # SM clock below (1 - this) x max clock under load
    client_cpu_share: float = 0.8               # the busiest client process's CPU time / wall time
    client_vs_server: float = 0.85              # client-measured tok/s below this x server's gen throughput
    drift_min_change: float = 0.02              # a baseline trend beyond noise that moved at least this much
    outlier_rel: float = 0.05                   # a run this much off its siblings' median ...
    outlier_mads: float = 4.0                   # ... and this many robust sd
    cycle_spread: float = 0.15                  # spec arm: cycle p90/p10 within a run, or run medians, beyond 1 + this
    baseline_steady: float = 0.05               # ... while the baseline's step stays within 1 + this
    instance_trend_min: float = 0.02            # an arm's instances moving this much with their run order


@dataclass
class Context:
    stats: ExperimentStats
    config: DoctorConfig
    validity: validity_analysis.Validity | None = None     # the output checks, read once when a rule asks
    truth: truthcheck.TruthReport | None = None               # the known-truth check (None: no known truth) ...
    truth_read: bool = False                                   # ... read once when a rule asks

    def outputs(self, exp: Experiment) -> validity_analysis.Validity:
        if self.validity is None:
            self.validity = validity_analysis.check(exp)
        return self.validity

    def known_truth(self, exp: Experiment) -> truthcheck.TruthReport | None:
        if not self.truth_read:
            self.truth, self.truth_read = truthcheck.check(exp), True
        return self.truth


Rule = Callable[[Experiment, Context], list[Finding]]


def _fmt_args(v) -> str:
    return "unset (engine default)" if v is None else repr(v)


# ---------------------------------------------------------------------------------------------- rules

def engine_generation(exp: Experiment, arms: list[str] | None = None) -> str:
    """The SGLang generation the runs of `arms` (default: every arm) met, from their /server_info readback
    (0.5.23: `cuda_graph_config`). An experiment with an engine axis has one generation per engine build."""
    names = arms if arms is not None else [a.name for a in exp.arms]
    for name in names:
        for r in exp.runs_of(name, ok_only=False):
            if r.server_args and "cuda_graph_config" in r.server_args:
                return engines.SGLANG_0_5_23
            if r.server_args and "cuda_graph_max_bs" in r.server_args:
                return engines.SGLANG_0_5_9
    return engines.SGLANG_0_5_9


def engine_version(exp: Experiment, arms: list[str]) -> str | None:
    """The engine version the runs of `arms` recorded in their manifests (the node's own report), if any."""
    for name in arms:
        for r in exp.runs_of(name, ok_only=False):
            v = ((r.manifest or {}).get("versions") or {}).get("sglang")
            if v and engines.parse_version(str(v)):
                return str(v)
    return None


def _declares(exp: Experiment, arm: str, baseline: str, key: str) -> bool:
    """Whether `arm` sets `key` in its own server_args with a value its baseline does not have."""
    if arm == baseline:
        return False
    a = next((x for x in exp.arms if x.name == arm), None)
    b = next((x for x in exp.arms if x.name == baseline), None)
    return bool(a and key in a.server_args and (b is None or b.server_args.get(key) != a.server_args[key]))


def baseline_groups(exp: Experiment) -> dict[str, list[str]]:
    """Each baseline with the arms compared with it (the baseline first): one group per condition of the
    matrix, e.g. per engine build, whose arms are meant to differ only in the speculative settings."""
    names = {a.name for a in exp.arms}
    groups: dict[str, list[str]] = {b: [b] for b in exp.baselines if b in names}
    for a in exp.arms:
        b = exp.baseline_of(a.name)
        if a.name != b:
            groups.setdefault(b, [b]).append(a.name)
    return groups


def _flag_on(gen: str, key: str) -> str:
    """How a logical server argument is spelt on that generation (advice names only flags the node has)."""
    if gen == engines.SGLANG_0_5_23 and key in engines.SPELLINGS:
        first = engines.SPELLINGS[key][0]
        return " ".join(engines.flag_of(k) + ("" if not isinstance(v, str) else f"={v}") for k, v in first)
    return engines.flag_of(key)


def verify_without_cuda_graph(exp: Experiment, ctx: Context) -> list[Finding]:
    out = []
    for arm in exp.spec_arms:
        if not arm.is_spec:
            continue
        gen = engine_generation(exp, [arm.name])
        runs = [r for r in exp.runs_of(arm.name) if r.log and (r.log.cuda_graph_true + r.log.cuda_graph_false)]
        if runs:
            t = sum(r.log.cuda_graph_true for r in runs)   # type: ignore[union-attr]
            f = sum(r.log.cuda_graph_false for r in runs)  # type: ignore[union-attr]
            ev = [f"{f} of {t + f} decode lines in {len(runs)} run(s) say `cuda graph: False`"]
            example = next((r.log.no_graph_example for r in runs if r.log and r.log.no_graph_example), None)
            if example:
                ev.append(f"log: {example}")
        else:       # no server log at hand: the device timer's pass counts (graph_passes over the measured window)
            runs = [r for r in exp.runs_of(arm.name) if _graph_passes(r) is not None]
            if not runs:
                continue
            t = sum(_graph_passes(r)[0] for r in runs)     # type: ignore[index]
            f = sum(_graph_passes(r)[1] for r in runs)     # type: ignore[index]
            ev = [f"{f:.0f} of {t + f:.0f} verify passes in {len(runs)} run(s) ran without a CUDA graph (the device "
                  "timer's pass counts)"]
        share = t / (t + f) if t + f else 1.0
        if share >= ctx.config.graph_share_min:
            continue
        ev[0] += f" (graph share {share:.0%})"
        declared = [k for k in ("disable_cuda_graph", "cuda_graph_backend_decode") if _declares(exp, arm.name,
                                                                                              exp.baseline_of(arm.name), k)]
        check = (f"The arm sets {', '.join(declared)} itself, so this is its treatment: the eager verify is what it "
                 "measures." if declared else
                 f"Check that {'--cuda-graph-backend-decode is not `disabled`' if gen == engines.SGLANG_0_5_23 else '--disable-cuda-graph is not set'} "
                 f"and {_flag_on(gen, 'cuda_graph_max_bs')} covers the running batch, then rerun.")
        out.append(Finding(
            "verify-without-cuda-graph", "warning",
            f"{arm.name}: the verify forward ran without a CUDA graph in {1 - share:.0%} of decode steps, so every "
            f"draft+verify cycle pays the eager (extend-mode) verify time. {check} The spec model shows how much a "
            f"shorter cycle lowers the break-even accept length.",
            ev, arm.name, [r.run_id for r in runs]))
    return out


def _graph_passes(r: Run) -> tuple[float, float] | None:
    """(graphed, eager) target decode/verify passes the device timer counted over the run's measured window."""
    pm = r.phase_metrics or {}
    g = pm.get("graph_passes") or {}
    t, f = g.get("decode_cuda_graph", 0.0), g.get("decode_none", 0.0)
    return (t, f) if pm.get("available") and t + f else None


def env_not_confirmed(exp: Experiment, ctx: Context) -> list[Finding]:
    """Every host's env check: the run's own, and each other rank's of a multi-node server."""
    out = []
    by_arm: dict[str, list[tuple[Run, str, list]]] = {}
    for r in exp.runs:
        checks = [("", r.env_check)] + [(f" (rank {k.rank} on {k.host})" if k.rank is not None else f" ({k.host})",
                                        k.env_check) for k in r.ranks]
        for where, check in checks:
            if check and check.unconfirmed():
                by_arm.setdefault(r.arm, []).append((r, where, check.unconfirmed()))
    for arm, items in by_arm.items():
        names = sorted({v.name for _, _, vs in items for v in vs})
        runs = list(dict.fromkeys(r.run_id for r, _, _ in items))
        ev = []
        for r, where, vs in items[:3]:
            for v in vs[:4]:
                detail = "; ".join(v.mismatches) or "no evidence in any worker"
                seen = ", ".join(v.evidence) or "none"
                ev.append(f"{r.run_id}{where}: {v.name} expected {v.expected!r}: {detail} (confirmed by: {seen})")
        out.append(Finding(
            "env-not-confirmed", "error",
            f"{arm}: {', '.join(names)} not confirmed in the engine's worker processes in {len(runs)} run(s); "
            f"the arm may have run without them. Put them in the env file the launch script sources (not only in "
            f"the parent shell), and keep env verification on so a mismatch fails the arm.",
            ev, arm, runs))
    return out


def _nccl_seen(r: Run, names: tuple[str, ...]) -> set[str]:
    seen = {k for k in names if k in r.env}
    if r.env_check:
        seen |= {v.name for v in r.env_check.variables if v.confirmed and v.name in names}
        seen -= {v.name for v in r.env_check.variables if not v.confirmed}
    if r.log:
        seen |= {k for k in r.log.nccl_env if k in names}
    return seen


def nccl_missing_baseline_slow(exp: Experiment, ctx: Context) -> list[Finding]:
    base = exp.runs_of(exp.baseline)
    if not base or all(economics.gpus_of(r.server_args) < 2 for r in base):
        return []       # one GPU (or a CPU engine): no NCCL traffic for the variables to tune
    names = ctx.config.tuned_nccl
    missing = sorted(set(names) - set.intersection(*(_nccl_seen(r, names) for r in base)))
    if not missing:
        return []
    tok = ctx.stats.arms[exp.baseline].tok_s_run.median
    usual = ctx.config.usual_baseline_tok_s
    ev = [f"baseline runs lack {', '.join(missing)} (intended env, env check and NCCL INFO lines)"]
    if usual and tok:
        ev.append(f"baseline median {tok:.1f} tok/s vs usual {usual:.1f} tok/s ({tok / usual - 1:+.0%})")
        if tok < usual * (1 - ctx.config.slower_than_usual):
            return [Finding(
                "nccl-untuned-baseline-slow", "warning",
                f"The baseline ran {1 - tok / usual:.0%} slower than usual and its workers lack the tuned NCCL "
                f"variables {', '.join(missing)}. Add them to the experiment's env and rerun; an A/B against a "
                f"slowed baseline flatters the speculative arms.",
                ev, exp.baseline, [r.run_id for r in base])]
        return []
    return [Finding(
        "nccl-untuned-baseline-slow", "info",
        f"The baseline's workers lack the tuned NCCL variables {', '.join(missing)}; pass the usual baseline "
        f"tok/s (--usual-baseline-tok-s) to judge whether it ran slower than usual.",
        ev, exp.baseline, [r.run_id for r in base])]


def _set_by_sglang(key: str, version: str, gen: str) -> str | None:
    """What SGLang itself sets differently for a speculative arm, for the keys it changes (the reason a key
    differs although the experiment did not set it per arm); None for a key SGLang leaves alone."""
    if key == "max_running_requests":
        return f"SGLang {version} caps a speculative server at max_running_requests=48"
    if key == "disable_overlap_schedule":
        return (None if engines.generation(gen).overlap_kept_under_spec else
                f"SGLang {version} turns the overlap scheduler off under speculation")
    if key in ("cuda_graph_bs", "cuda_graph_max_bs"):
        return f"SGLang {version} captures CUDA graphs at other batch sizes for speculative arms"
    return None


def _graph_for_each_batch(key: str, value: object, load: int) -> tuple | None:
    """Which CUDA graph a decode batch of 1..load requests runs under a graph setting: for ``cuda_graph_bs`` the
    smallest captured size that holds it (None: eager), for ``cuda_graph_max_bs`` whether it is captured at all.
    None where the value was not read back (the engine's default is not known here)."""
    if key == "cuda_graph_bs" and isinstance(value, (list, tuple)) and all(isinstance(b, int) for b in value):
        return tuple(min((s for s in value if s >= b), default=None) for b in range(1, load + 1))
    if key == "cuda_graph_max_bs" and isinstance(value, int):
        return tuple(b <= value for b in range(1, load + 1))
    return None


def _alike_at_load(key: str, values: dict[str, object], load: int) -> bool:
    """Whether arms that differ in a graph batch-size setting ran every batch this experiment could form (at most
    ``load`` requests in flight) under the same graph: then the difference did not touch the A/B."""
    if key not in ("cuda_graph_bs", "cuda_graph_max_bs"):
        return False
    used = [_graph_for_each_batch(key, v, load) for v in values.values()]
    return None not in used and len(set(used)) == 1


def arms_not_like_for_like(exp: Experiment, ctx: Context) -> list[Finding]:
    """Within each baseline group (an engine build's arms, a matrix condition's arms), the arms should
    differ in the speculative settings only; the advice is spelt for that group's SGLang generation. Graph
    batch sizes that differ only above the requests in flight are an info: no batch of this A/B ran differently."""
    out = []
    groups = baseline_groups(exp)
    for base_name, names in groups.items():
        gen = engine_generation(exp, names)
        load = max(arm_concurrency(exp, n) for n in names)
        values: dict[str, dict[str, object]] = {}
        for name in names:
            a = next((x for x in exp.arms if x.name == name), None)
            runs = exp.runs_of(name, ok_only=False)
            effective = runs[0].server_args if runs and runs[0].server_args else (a.server_args if a else {})
            values[name] = {k: effective.get(k) for k in LIKE_FOR_LIKE}
            if "cuda_graph_config" in effective:        # 0.5.23 readback: graph settings per phase
                values[name]["cuda_graph_max_bs"] = engines.graph_max_bs(effective)
                values[name]["disable_cuda_graph"] = engines.graph_disabled(effective)
                values[name]["cuda_graph_bs"] = (effective["cuda_graph_config"].get("decode") or {}).get("bs")
        # a key an arm sets in its own server_args (the baseline does not) is the arm's declared treatment, as
        # its speculative settings are: what the A/B compares, not a confound
        declared = {name: [k for k in LIKE_FOR_LIKE if _declares(exp, name, base_name, k)] for name in names}
        diffs, unused = [], []
        for k in LIKE_FOR_LIKE:
            seen = {arm: v[k] for arm, v in values.items()}
            rest = {arm: v for arm, v in seen.items() if k not in declared[arm]}
            if len({repr(v) for v in rest.values()}) > 1:
                (unused if _alike_at_load(k, seen, load) else diffs).append((k, seen))
        if not diffs and not unused:
            continue
        shown = diffs or unused
        ev = [f"{k}: " + ", ".join(f"{arm}={_fmt_args(v)}" for arm, v in seen.items()) for k, seen in shown]
        treatments = [f"{arm}: {', '.join(ks)}" for arm, ks in declared.items() if ks]
        if treatments:
            ev.append("declared by the arm itself (its treatment, not a confound): " + "; ".join(treatments))
        if diffs and unused:
            ev.append(f"alike at up to {load} in flight (every batch ran the same graph in each arm): "
                      + ", ".join(k for k, _ in unused))
        fix = ", ".join(_flag_on(gen, k) for k, _ in shown)
        version = engine_version(exp, names) or gen
        why = [w for w in (_set_by_sglang(k, version, gen) for k, _ in shown) if w]
        which = f"The arms compared with {base_name}" if len(groups) > 1 else "The arms"
        keys = ", ".join(k for k, _ in shown)
        because = f": {'; '.join(why)}" if why else ""
        if diffs:
            out.append(Finding(
                "arms-not-like-for-like", "warning",
                f"{which} differ in more than the speculative settings ({keys}), so the A/B is not like for like"
                f"{because}. Set {fix} explicitly in the experiment's common server_args so every arm runs with the "
                f"same values.", ev, None, []))
        else:
            flight = f"{load} request in flight" if load == 1 else f"up to {load} requests in flight"
            out.append(Finding(
                "arms-not-like-for-like", "info",
                f"{which} differ in their CUDA graph batch sizes ({keys}){because}; at {flight} every batch ran the "
                f"same graph in each arm, so this A/B is like for like. At higher loads it would not be: set {fix} "
                f"explicitly in the experiment's common server_args to keep them equal.", ev, None, []))
    return out


def accept_below_break_even(exp: Experiment, ctx: Context) -> list[Finding]:
    st = ctx.stats
    out = []
    for arm in exp.spec_arms:
        base = st.arms.get(exp.baseline_of(arm.name))
        if not base or not base.tok_s_run.median:
            continue
        a = st.arms.get(arm.name)
        steps = arm.steps
        if not a or not a.tok_s_run.median or not a.accept_len.mean or not steps:
            continue
        try:
            m = specmodel.analyse_arm(specmodel.SpecArm(steps, a.tok_s_run.median, a.accept_len.mean, arm.name),
                                      base.tok_s_run.median)
        except specmodel.SpecModelError:
            continue
        if m.margin >= 0:
            continue
        try:
            need = f"a conditional acceptance of {specmodel.chain_alpha(m.tau_star, steps):.2f} per position " \
                   f"(now {m.alpha:.2f})"
        except specmodel.SpecModelError:
            need = f"more than steps+1 = {steps + 1} tokens per cycle, impossible at steps={steps}"
        out.append(Finding(
            "accept-below-break-even", "warning",
            f"{arm.name}: accept length {m.accept_len:.2f} is below the break-even {m.tau_star:.2f} "
            f"(cycle {m.cycle_ms:.1f} ms / baseline step {1000 / base.tok_s_run.median:.1f} ms), so speculation "
            f"loses ({_speedup_text(st, arm.name, m.speedup)}). Breaking even needs {need}, or a shorter cycle "
            f"(verify with CUDA graph).",
            [f"baseline {base.tok_s_run.median:.1f} tok/s, {arm.name} {a.tok_s_run.median:.1f} tok/s at accept "
             f"length {a.accept_len.mean:.2f} (from {a.requests} requests), steps={steps}",
             f"tau* = cycle/step = {m.cycle_ms:.2f}/{1000 / base.tok_s_run.median:.2f} = {m.tau_star:.2f}, "
             f"margin {m.margin:+.2f}"], arm.name, []))
    return out


def _mean_output_tokens(exp: Experiment, arm: str) -> float | None:
    v = [q.output_tokens for r in exp.runs_of(arm) for q in r.measured if q.output_tokens]
    return statistics.fmean(v) if v else None


def accept_len_mismatch(exp: Experiment, ctx: Context) -> list[Finding]:
    out = []
    for arm in exp.spec_arms:
        a = ctx.stats.arms.get(arm.name)
        if not a or not a.accept_len_disagrees or not a.accept_len.mean or not a.log_accept_len:
            continue
        ev = [f"requests: completion_tokens / spec_verify_ct = {a.accept_len.mean:.3f} over {a.requests} requests",
              f"server log: mean `accept len` = {a.log_accept_len:.3f}"]
        # The requests' value counts the token prefill produced (no verify step made it): with L output
        # tokens it reads L / (L - 1) above the log's per-verify-step mean. Short outputs show this alone.
        length = _mean_output_tokens(exp, arm.name)
        ratio = a.accept_len.mean / a.log_accept_len
        first_token = length is not None and length > 1 and abs(ratio / (length / (length - 1)) - 1) < 0.02
        if first_token:
            ev.append(f"{length:.0f} output tokens per request: the prefill token alone makes the requests' value "
                      f"{length / (length - 1):.3f}x the log's; measured {ratio:.3f}x")
            why = (f"The requests average only {length:.0f} output tokens, and their accept length counts the first "
                   f"token (made by prefill, not by a verify step), which alone explains the gap. Measure accept "
                   f"length with longer outputs (>= 128 tokens) before comparing it with the log or the break-even.")
        else:
            why = ("The log averages over windows that may include warm-ups or other clients' traffic; the report "
                   "uses the requests' value. Check that nothing else sent requests to the server during the run.")
        out.append(Finding(
            "accept-length-mismatch", "warning",
            f"{arm.name}: the accept length measured from this arm's requests ({a.accept_len.mean:.2f}) disagrees "
            f"with the server log's `accept len` ({a.log_accept_len:.2f}). " + why, ev, arm.name, []))
    return out


def gpu_throttled(exp: Experiment, ctx: Context) -> list[Finding]:
    """GPU samples of every host of the run (a multi-node server's ranks sample their own GPUs: one slow
    GPU slows the whole tensor-parallel server), each GPU against its own maximum clock."""
    out = []
    for r in exp.runs:
        w = r.window
        samples = [s for s in r.gpu_samples if w is None or w[0] <= s.ts <= w[1]]
        if not samples:
            continue
        several = len({s.host for s in r.gpu_samples}) > 1

        def gpu(s: GpuSample) -> str:
            return f"GPU {s.index}" + (f" on {s.host}" if several and s.host else "")

        bad_reasons = [s for s in samples if s.reasons and s.reasons & ~REASON_IDLE]
        max_by_gpu: dict[tuple[str | None, int], float] = {}
        for s in r.gpu_samples:
            ref = s.max_sm_mhz or s.sm_mhz
            if ref:
                max_by_gpu[s.host, s.index] = max(max_by_gpu.get((s.host, s.index), 0.0), ref)
        dropped = [s for s in samples if s.sm_mhz and max_by_gpu.get((s.host, s.index))
                   and s.sm_mhz < (1 - ctx.config.clock_drop) * max_by_gpu[s.host, s.index]
                   and not (s.reasons == REASON_IDLE)]
        if not bad_reasons and not dropped:
            continue
        ev = []
        if bad_reasons:
            names = sorted({n for s in bad_reasons for n in reason_names(s.reasons & ~REASON_IDLE)})
            s = bad_reasons[0]
            where = sorted({str(x.host) for x in bad_reasons}) if several else []
            ev.append(f"{len(bad_reasons)} of {len(samples)} samples during the measured window report clock event "
                      f"reasons {', '.join(names)}" + (f" (on {', '.join(where)})" if where else "")
                      + f"; first: {gpu(s)} at {s.ts:.1f}: reasons 0x{s.reasons:x}, SM {s.sm_mhz} MHz")
        if dropped:
            s = min(dropped, key=lambda x: x.sm_mhz or 0)
            ev.append(f"{len(dropped)} samples with the SM clock below {1 - ctx.config.clock_drop:.0%} of the maximum; "
                      f"lowest: {gpu(s)} {s.sm_mhz:.0f} MHz vs {max_by_gpu[s.host, s.index]:.0f} MHz")
        out.append(Finding(
            "gpu-throttled", "warning",
            f"{r.run_id}: the GPUs slowed down during the measured window (power/thermal/clock limits), so this run "
            f"measured the node's cooling or power cap, not the arm. Check cooling and power limits (nvidia-smi -q -d "
            f"PERFORMANCE), consider locking clocks, and rerun the block.", ev, r.arm, [r.run_id]))
    return out


def baseline_drift(exp: Experiment, ctx: Context) -> list[Finding]:
    d = ctx.stats.drift
    out = []
    # beyond noise AND large enough to matter: with a few runs, a 95% interval excludes zero by chance in
    # one experiment in twenty, and a trend of 1% moves no verdict made at the usual 2% precision
    if d.beyond_noise and d.change_rel is not None and abs(d.change_rel) >= ctx.config.drift_min_change:
        pts = ", ".join(f"{t / 60:.0f} min: {v:.1f}" for t, v in d.points[:8])
        moved = instances.machine_changes(exp)
        out.append(Finding(
            "baseline-drift", "warning",
            f"The baseline drifted {d.change_rel * 100:+.1f}% during the experiment, beyond run-to-run noise. "
            + ("Its host changed machines during the experiment (see the evidence): that, not the run order, may be "
               "the drift. " if moved else "")
            + ("Paired blocks cancel a slow drift in the speedup, but absolute tok/s numbers are not comparable "
               "across sessions; record node temperature/clocks and look for other load."
               if not d.exposed else
               "This experiment ran in blocked order, so the drift biases the speedups: rerun with --order interleaved."),
            [d.message, f"baseline tok/s over time: {pts}"] + moved, exp.baseline, []))
    elif d.exposed:
        out.append(Finding(
            "blocked-order", "info",
            "This experiment ran in blocked order: a drift too slow to detect here would still bias the speedups. "
            "Prefer --order interleaved.", [d.message], None, []))
    return out


def _server_tok_s_per_request(r: Run, concurrency: int) -> tuple[float, str] | None:
    """What the server says one request decoded at: its `gen throughput` is the whole batch's, so the
    log summary's median of `gen throughput / #running-req` over the decode lines (simulated units on a
    time-scaled node, converted by the loader); a log without running counts: the median gen throughput
    over the client's concurrency (never above the per-request value, so it cannot raise a false alarm)."""
    if r.log is None:
        return None
    if r.log.gen_tok_s_per_req_median:
        return r.log.gen_tok_s_per_req_median, "median over the decode lines of gen throughput / #running-req"
    if r.log.gen_tok_s_median:
        how = "median gen throughput" + (f" / concurrency {concurrency}" if concurrency > 1 else "")
        return r.log.gen_tok_s_median / concurrency, how
    return None


def client_bottleneck(exp: Experiment, ctx: Context) -> list[Finding]:
    out = []
    for r in exp.runs:
        conc = arm_concurrency(exp, r.arm)       # the run's own load (a matrix's concurrency, else the bench's)
        ev = []
        # judged by the busiest client process: one Python process (one GIL) at a whole core is the bottleneck,
        # however many processes share the load; their sum above one core is not
        busiest = r.client_cpu_max_proc_s if r.client_cpu_max_proc_s is not None else r.client_cpu_s
        if busiest is not None and r.duration_s:
            share = busiest / r.duration_s
            if share >= ctx.config.client_cpu_share:
                if r.client_procs > 1:
                    ev.append(f"busiest of {r.client_procs} client processes: CPU {busiest:.1f} s over "
                              f"{r.duration_s:.1f} s wall ({share:.0%} of a core; all together "
                              f"{(r.client_cpu_s or busiest):.1f} s)")
                else:
                    ev.append(f"client CPU {busiest:.1f} s over {r.duration_s:.1f} s wall ({share:.0%} of a core)")
        tok = r.tok_s
        server = _server_tok_s_per_request(r, conc) if tok else None
        # With several requests in flight the server's rate is above the client's without the client being slow:
        # the decode lines' median leaves out the lines in which arriving requests' prefills paused the batch,
        # which every running request waits through (phase-accounting's finding; on the H200, EAGLE-3 at 4 in
        # flight: 631 tok/s per running request in the lines, 462 at the client, the client at 8 % of a core).
        # There the gap only backs up the client's own CPU load.
        if server and tok and tok < ctx.config.client_vs_server * server[0] and (conc == 1 or ev):
            ev.append(f"client measured {tok:.1f} tok/s per request while the server logged gen throughput "
                      f"{server[0]:.1f} tok/s per running request ({server[1]}): {tok / server[0]:.0%}")
        if ev:
            out.append(Finding(
                "client-bottleneck", "warning",
                f"{r.run_id}: the benchmark client, not the server, may have limited this measurement. Run the client "
                f"on idle cores next to the server, spread it over more processes (bench.client_procs, now "
                f"{r.client_procs}; auto gives one per {contract.CLIENT_SLOTS_PER_PROC} requests in flight), and rerun.",
                ev, r.arm, [r.run_id]))
    return out


def bursty_delivery(exp: Experiment, ctx: Context) -> list[Finding]:
    """Requests whose tokens reached the client in bursts after a stall (node/loadgen `buffered`): their chunk
    times are not the engine's decode pace and were left out of tok/s; the arm's tok/s rests on the others, and a
    run with no other request on the engine's own decode rate where the engine reports one (Run.tok_s_source)."""
    out = []
    both: list[float] | None = None       # engine vs client rate, % apart, on the runs with both: when one is needed
    for a in exp.arms:
        runs = [r for r in exp.runs_of(a.name) if r.buffered_requests]
        if not runs:
            continue
        hit = sum(r.buffered_requests for r in runs)
        total = sum(len(r.measured) for r in exp.runs_of(a.name))
        engine = [r.run_id for r in runs if r.tok_s_source == "engine"]
        rated = ""
        if engine:
            if both is None:
                both = [(r.engine_tok_s / r.tok_s - 1) * 100 for r in exp.runs
                        if r.tok_s_source == "client" and r.engine_tok_s and r.tok_s]
            agree = (f"on the {len(both)} runs where both were measured the engine's rate was "
                     f"{min(both):+.1f} % to {max(both):+.1f} % of the client's" if both else
                     "no run here measured both, so how far the two agree is not known")
            rated = (f" {', '.join(engine)} had no request the client could time: their tok/s is the engine's own "
                     f"decode rate over the same requests ({agree}).")
        out.append(Finding(
            "bursty-delivery", "warning" if hit * 2 > total else "info",
            f"{a.name}: {hit} of {total} measured requests reached the client in bursts (a stall, then most tokens "
            f"at once): their timing is not the engine's decode pace and is left out of tok/s.{rated} The server's "
            f"HTTP front end or the client was starved of CPU: give the engine host idle cores (nothing else "
            f"running), or compare with the engine's own inter-token latency.",
            [f"{r.run_id}: {r.buffered_requests} of {len(r.measured)} requests in bursts"
             + (f"; tok/s {r.tok_s:.1f} from the engine" if r.tok_s_source == "engine" and r.tok_s else "")
             for r in runs],
            a.name, [r.run_id for r in runs]))
    return out


def instance_outlier(exp: Experiment, ctx: Context) -> list[Finding]:
    from scipy import stats as scipy_stats
    out = []
    for a in exp.arms:
        runs = [r for r in exp.runs_of(a.name) if r.tok_s]
        if len(runs) < 3:
            continue
        for r in runs:
            sib = [x.tok_s for x in runs if x is not r]
            med = statistics.median(sib)
            mad = float(scipy_stats.median_abs_deviation(sib, scale="normal"))   # sigma-consistent MAD
            dev = r.tok_s - med   # type: ignore[operator]
            if abs(dev) / med > ctx.config.outlier_rel and abs(dev) > ctx.config.outlier_mads * max(mad, 1e-9):
                out.append(Finding(
                    "instance-outlier", "warning",
                    f"{r.run_id}: {r.tok_s:.1f} tok/s is {dev / med:+.0%} off its siblings' median {med:.1f} tok/s. "
                    f"This server instance behaved differently (placement, clocks, a neighbour's load): check its "
                    f"GPU samples and log, and rerun the block rather than trusting this pair.",
                    [f"{a.name} runs: " + ", ".join(f"{x.run_id}={x.tok_s:.1f}" for x in runs)], a.name, [r.run_id]))
    return out


def instance_trend(exp: Experiment, ctx: Context) -> list[Finding]:
    """An arm's instances on a host whose speed follows the order they started in: the first ones low (a freshly
    started node warming up), or tok/s moving along the run order (specab.analysis.cost.instances.trends)."""
    return [Finding("instance-trend", "warning", t.message(), t.evidence(), t.arm, t.low or list(t.run_ids))
            for t in instances.trends(exp, ctx.config.instance_trend_min)]


def _cycle_ms(q) -> float | None:
    """A speculative request's mean verify cycle: its decode time (after the first token) over its verify passes.
    The cycle's duration does not depend on how many drafts it accepted, so it is a pure timing quantity."""
    if not q.ok or q.warmup or not q.spec_verify_ct or q.e2e_s is None or q.ttft_s is None:
        return None
    return (q.e2e_s - q.ttft_s) / q.spec_verify_ct * 1e3


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(p10, median, p90) of ``values`` (at least two)."""
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[0], statistics.median(values), deciles[-1]


def cycle_time_unstable(exp: Experiment, ctx: Context) -> list[Finding]:
    """A speculative arm whose verify cycle took different times at the same settings (within runs, in stretches
    of requests, or between its server instances) while its baseline's decode step held steady: the time is not
    the GPU's work, which the baseline shares, but the host's. A speculative loop meets the CPU every cycle
    (accepting drafts, scheduling the next), so the host's CPU speed and neighbours set its pace; that variation
    is what widens such an arm's interval, and more requests per run cannot remove it."""
    spread = 1 + ctx.config.cycle_spread
    out = []
    for a in exp.spec_arms:
        if concurrency.served(exp, a.name) or concurrency.served(exp, exp.baseline_of(a.name)):
            continue        # its server queued requests: the batch changed size as the queue drained (server-queued)
        base_steps = {r.run_id: [q.tpot_s * 1e3 for q in r.requests if q.ok and not q.warmup and q.tpot_s]
                      for r in exp.runs_of(exp.baseline_of(a.name))}
        base_steps = {k: v for k, v in base_steps.items() if len(v) >= 2}
        if not base_steps:
            continue
        base = [_spread(v) for v in base_steps.values()]
        base_meds = [m for _, m, _ in base]
        # how far the baseline's step moved: within its worst run (p90 / p10) or between its runs' medians
        base_moved = max(max(p90 / p10 for p10, _, p90 in base), max(base_meds) / min(base_meds))
        if base_moved > 1 + ctx.config.baseline_steady:
            continue        # the baseline moves too: a node-wide cause, not the speculative loop's
        runs = {r.run_id: [c for c in map(_cycle_ms, r.requests) if c is not None] for r in exp.runs_of(a.name)}
        runs = {k: v for k, v in runs.items() if len(v) >= 2}
        if not runs:
            continue
        stats_of = {k: _spread(v) for k, v in runs.items()}
        meds = [m for _, m, _ in stats_of.values()]
        within = {k: p90 / p10 for k, (p10, _, p90) in stats_of.items()}
        between = max(meds) / min(meds)
        if max(within.values()) <= spread and between <= spread:
            continue
        fastest = min(min(v) for v in runs.values())
        slow_share = sum(c > fastest * spread for v in runs.values() for c in v) / sum(len(v) for v in runs.values())
        clocks = [s.sm_mhz / s.max_sm_mhz for r in exp.runs_of(a.name) for s in r.gpu_samples
                  if s.sm_mhz and s.max_sm_mhz and (s.util_pct or 0) > 0]
        clock_text = ("" if not clocks else ", and its GPU ran at its maximum clock under load" if min(clocks) >= 0.99
                      else f", and its GPU ran at {min(clocks):.0%}-{max(clocks):.0%} of its maximum clock under load")
        where = []
        if max(within.values()) > spread:
            where.append(f"within a run by up to {max(within.values()) - 1:.0%} (cycle p90 / p10)")
        if between > spread:
            where.append(f"between its server instances by {between - 1:.0%} (run medians "
                         f"{min(meds):.2f}-{max(meds):.2f} ms)")
        out.append(Finding(
            "cycle-time-unstable", "warning",
            f"{a.name}: the speculative cycle took different times at the same settings, "
            + " and ".join(where) + f"; {slow_share:.0%} of its requests ran more than {spread - 1:.0%} slower than "
            f"its fastest cycle ({fastest:.2f} ms). Its baseline's decode step stayed within "
            f"{base_moved - 1:.1%}{clock_text}: the difference is the host's "
            f"CPU-side work, which a speculative loop meets every cycle (CPU frequency and idle states, other "
            f"processes on the server's cores), not the GPU's. This is what widens the arm's interval and more "
            f"requests per run do not remove it: pin the server to idle cores and a fixed CPU frequency (the "
            f"`performance` governor), or give the verdict more blocks.",
            [f"{k}: cycle p10/median/p90 {p10:.2f}/{m:.2f}/{p90:.2f} ms over {len(runs[k])} requests"
             for k, (p10, m, p90) in stats_of.items()]
            + [f"baseline step medians: " + ", ".join(f"{k}={v:.3f} ms" for k, v in zip(base_steps, base_meds))],
            a.name, list(runs)))
    return out



def dominant_phase(exp: Experiment, ctx: Context) -> list[Finding]:
    """Name the phase that takes most of each speculative arm's cycle, with its numbers (measured phases)."""
    out = []
    for name, a in phase_analysis.analyse_phases(exp).arms.items():
        phase, ms = a.dominant()
        cycle = a.implied_cycle_ms.mean
        msg = f"{phase} {ms:.1f} ms of a {cycle:.1f} ms cycle ({ms / cycle:.0%})"
        if phase == "verify" and a.graph_share is not None:
            msg += (f", no CUDA graph in {1 - a.graph_share:.0%} of verify passes" if a.graph_share < 0.5 else
                    f", a CUDA graph in {a.graph_share:.0%} of verify passes")
        evidence = [_cycle_evidence(a)]
        tau_star = a.tau_star()
        if tau_star is not None and a.baseline_step_ms:
            msg += f"; break-even tau* {tau_star:.2f} (cycle / baseline step {a.baseline_step_ms:.2f} ms)"
            if phase == "verify" and (a.graph_share or 0.0) < 0.5:
                graphed = a.tau_star(a.baseline_step_ms)
                msg += (f"; a graphed verify at ~{a.baseline_step_ms:.1f} ms (the baseline's graphed decode step) "
                        f"would move tau* from {tau_star:.2f} to {graphed:.2f}")
        out.append(Finding("dominant-phase", "info", msg + ".", evidence, name, [r.run_id for r in a.runs]))
    return out


def _cycle_evidence(a: phase_analysis.ArmPhases) -> str:
    return (f"per cycle over {len(a.runs)} run(s): draft {a.draft_ms.mean:.2f} ms, draft-extend "
            f"{a.draft_extend_ms.mean:.2f} ms, verify {a.verify_ms.mean:.2f} ms, other {a.other_ms.mean:.2f} ms "
            f"(implied cycle = tau / tok/s)" + (f"; {a.batch:.1f} requests per verify pass, each phase the whole "
                                                 f"batched pass" if a.batch > 1.05 else ""))


def phase_accounting(exp: Experiment, ctx: Context) -> list[Finding]:
    """Measured phases against the cycle implied by tok/s and tau: more than the cycle is impossible (window or
    tau off); a large remainder is engine time outside the forward passes."""
    out = []
    for name, a in phase_analysis.analyse_phases(exp).arms.items():
        cycle, measured = a.implied_cycle_ms.mean, a.measured_ms
        if measured > cycle * (1 + phase_analysis.CONSISTENCY_TOL):
            out.append(Finding("phase-accounting", "warning",
                               f"measured forward phases {measured:.1f} ms exceed the implied cycle {cycle:.1f} ms "
                               f"by {measured / cycle - 1:.0%}: the /metrics window or tau does not match the "
                               f"measured requests (another client on the server? warm-up inside the window?).",
                               [_cycle_evidence(a)], name, [r.run_id for r in a.runs]))
        elif a.other_ms.mean > cycle * phase_analysis.OTHER_SHARE_FINDING:
            # in a batch, a request's cycle also waits for the prefills of requests that arrive meanwhile: those
            # are forward passes too, just not its own cycle's, and not engine overhead
            why = ("engine overhead (scheduling, sampling, CPU work) worth profiling (/start_profile)"
                   if a.batch <= 1.05 else
                   f"with {a.batch:.1f} requests per verify pass, the prefills of arriving requests pause every "
                   f"running one ({a.prefill_ms:.1f} ms of prefill per verify pass: a property of the load, not of "
                   f"the engine); the rest is scheduling, sampling and CPU work")
            out.append(Finding("phase-accounting", "warning" if a.batch <= 1.05 else "info",
                               f"{a.other_ms.mean:.1f} ms of the {cycle:.1f} ms cycle ({a.other_ms.mean / cycle:.0%}) "
                               f"is outside the forward passes: {why}.", [_cycle_evidence(a)], name,
                               [r.run_id for r in a.runs]))
    return out


def _speedup_text(st: ExperimentStats, arm: str, ratio_of_medians: float | None) -> str:
    """The arm's speedup as the report's speedup table states it (paired within blocks), so one number stands for
    one thing; the ratio of the arms' medians only where no block was paired."""
    sp = st.speedups.get(arm)
    if sp is not None and sp.estimate is not None:
        return f"{sp.estimate:.3f}x paired"
    return f"{ratio_of_medians:.3f}x, ratio of medians" if ratio_of_medians is not None else "slower"


def known_truth_mismatch(exp: Experiment, ctx: Context) -> list[Finding]:
    """Runs of known-truth models whose measurement disagrees with the exact truth: a cycle count, the accept
    length or the greedy output that is not what the models make certain. Not a property of the arm: the
    measurement chain (the engine's counters, the client, the store) is broken, so every number of the run is
    suspect. An arm whose settings force or relax acceptance (engines.output_departures) is meant to break the
    truth's exact verification: outputs-not-valid names it, not this rule."""
    rep = ctx.known_truth(exp)
    if rep is None:
        return []
    out = []
    for arm in dict.fromkeys(r.arm for r, _ in rep.problems):
        a = exp.arm(arm)
        if engines.output_departures(a.server_args, a.env):
            continue
        runs = [r for r in rep.runs if r.arm == arm and r.problems]
        evidence = [f"{r.run_id}: {p}" for r in runs for p in r.problems][:8]
        out.append(Finding("known-truth-mismatch", "error",
                           f"{len(runs)} run(s) of known-truth models disagree with the exact truth (cycle counts, "
                           f"accept length or the greedy rule): the measurement chain is broken, not the draft. "
                           f"Check which engine build served the run and the client's per-request counters before "
                           f"trusting any number of these runs.", evidence, arm, [r.run_id for r in runs]))
    return out


def known_truth_unchecked(exp: Experiment, ctx: Context) -> list[Finding]:
    """Runs of known-truth models whose check could not run: a known_truth.json the client could not use, a
    speculative run whose draft has no truth, a pooled store that is gone. Each finding names the file, so a
    known-truth experiment never loses its check in silence."""
    rep = ctx.known_truth(exp)
    if rep is None:
        return []
    return [Finding("known-truth-unchecked", "warning",
                    f"{len(u.runs)} run(s) of known-truth models were not checked against the exact truth: "
                    f"{u.reason}. Their numbers stand without that check until the file named is restored or fixed "
                    f"(a model's known_truth.json: then the runs run again).",
                    [f"{rid}: {u.reason}" for rid in u.runs][:8],
                    u.arms[0] if len(u.arms) == 1 else None, u.runs)
            for u in rep.unchecked]


def forced_continuation(exp: Experiment, ctx: Context) -> list[Finding]:
    """Most of a speculative arm's measured requests of a dataset (real prompts, whose answers end) ran to output_len
    with bench.ignore_eos true: the engine skipped every end-of-sequence token, so its acceptance was measured on
    continuations past the answers' natural ends. The evidence is the client's own record of each run (its
    bench_summary: the workload and ignore_eos) and the engine's finish reason per request (length: output_len
    reached). Seeded word prompts (kind synthetic) have no answer to end: the report's length note covers them."""
    out = []
    for arm in exp.spec_arms:
        runs = [r for r in exp.runs_of(arm.name)
                if r.workload and r.workload.get("ignore_eos") is True and r.workload.get("kind") != "synthetic"]
        reqs = [q for r in runs for q in r.measured]
        length = sum(1 for q in reqs if q.finish_reason == "length")
        if not reqs or 2 * length <= len(reqs):
            continue
        toks = [q.output_tokens for q in reqs if q.output_tokens]
        out.append(Finding(
            "forced-continuation", "warning",
            f"{arm.name}: {length} of {len(reqs)} measured requests on real prompts ran to output_len with "
            f"bench.ignore_eos true: the engine skipped the end-of-sequence token, so the accept length and the "
            f"per-position acceptance were measured on continuations past the answers' natural ends, where draft and "
            f"target agree differently from real answers. Set bench.ignore_eos: false to measure the answers "
            f"themselves (output_len then caps them); keep it true only to hold output lengths equal across arms.",
            [f"{r.run_id}: workload {workload.describe(r.workload)}, ignore_eos true (bench_summary.json)"
             for r in runs][:3]
            + [f"finish reason length on {length} of {len(reqs)} measured requests (the engine's own)"
               + (f", output tokens {min(toks)}-{max(toks)}" if toks else "")],
            arm.name, [r.run_id for r in runs]))
    return out


def server_queued(exp: Experiment, ctx: Context) -> list[Finding]:
    """An arm whose server ran fewer requests at once than were in flight, by its own log (SGLang's `#running-req`
    and `#queue-req`, vLLM's `Running` and `Waiting`): the rest waited in its queue (its cap, e.g.
    max_running_requests, below bench.concurrency, asked with bench.allow_queueing). Its requests' times include
    that wait and its batch changed size as the queue drained: the per-user speed is at the server's running
    count, not at the requests in flight, and the variation is the queue's, not the host's CPU."""
    out = []
    for a in exp.arms:
        ran = concurrency.served(exp, a.name)
        if ran is None:
            continue
        running, queued = ran
        asked = arm_concurrency(exp, a.name)
        runs = [r for r in exp.runs_of(a.name) if r.log is not None and r.log.queued_max]
        out.append(Finding(
            "server-queued", "warning",
            f"{a.name}: {asked} requests were in flight but its server ran at most {running} at once and held up to "
            f"{queued} in its queue (its own log): each request's time includes its wait in the queue, and the batch "
            f"changed size as the queue drained. Its tok/s is per user at {running} running with a queue, not at "
            f"{asked} in flight; the spread between its requests is the queue's, not the host's CPU. Raise the "
            f"server's cap of running requests (server_args.max_running_requests / max_num_seqs) to {asked}, or "
            f"lower bench.concurrency to {running}.",
            [f"{r.run_id}: at most {r.log.running_max} running, {r.log.queued_max} queued" for r in runs],
            a.name, [r.run_id for r in runs]))
    return out


def _parity_evidence(v: validity_analysis.ArmValidity) -> list[str]:
    ev = []
    if v.identical_ci is not None:
        ev.append(f"identical to the baseline on {v.identical}/{v.compared} requests (95% CI "
                  f"{v.identical_ci[0]:.0%}-{v.identical_ci[1]:.0%})")
    ev += [f"request {q.i} (block {q.block}): agrees with the baseline on its first {q.agreed} of {q.tokens} {v.unit}"
           for q in v.requests if not q.passes][:3]
    if v.mean_len and v.baseline_mean_len:
        ev.append(f"mean output length {v.mean_len:.1f} vs the baseline's {v.baseline_mean_len:.1f} {v.unit}; "
                  f"finish reasons {v.finish} vs {v.baseline_finish}")
    if v.loops:
        ev.append(f"outputs that loop: requests {', '.join(str(i) for i in v.loops[:8])}")
    return ev


def outputs_not_valid(exp: Experiment, ctx: Context) -> list[Finding]:
    """A speculative arm whose outputs are not its baseline's (specab/analysis/validity.py): its speedup is other
    work done faster. The cause is named where the arm's settings show it (engines.output_departures: forced or
    relaxed acceptance; engines.output_differences: another model, tokenizer, dtype or decoding defaults)."""
    out = []
    for name, v in ctx.outputs(exp).arms.items():
        if v.status != validity_analysis.NOT_VALID:
            continue
        arm, base = exp.arm(name), exp.arm(v.baseline)
        causes = (engines.output_departures(arm.server_args, arm.env)
                  + engines.output_differences(arm.server_args, base.server_args))
        runs = [r.run_id for r in exp.runs_of(name)]
        if v.cost_only:
            out.append(Finding("outputs-not-valid", "info",
                               f"{name} is declared cost_only: {v.line[len('NOT VALID: '):]}, as declared; it is a "
                               f"cost measurement and no speedup is claimed for it"
                               + (f" (cause: {'; '.join(causes)})." if causes else "."),
                               _parity_evidence(v), name, runs))
            continue
        cause, todo = ((f"cause in its settings: {'; '.join(causes)}", "Remove the setting, or declare the arm "
                        "cost_only: true if it is meant as a cost measurement.") if causes else
                       ("no setting of the arm explains it", "Compare the engine builds of the two arms, the draft's "
                        "vocabulary mapping and tokenizer, and run --correctness (the engine's deterministic mode), "
                        "where any greedy difference is a bug rather than numerics."))
        out.append(Finding("outputs-not-valid", "error",
                           f"{name}: {v.line}; {cause}. Its speedup is not the same work done faster: the verdict "
                           f"does not hold. {todo}", _parity_evidence(v), name, runs))
    return out


def deterministic_pass_differs(exp: Experiment, ctx: Context) -> list[Finding]:
    """The deterministic pass (--correctness) of a speculative arm whose outputs differ from its baseline's in the
    engine's deterministic mode, where neither the batch nor speculation may change a greedy output: an engine bug.
    Names the arm, the mode and the first differing request."""
    out = []
    for d in ctx.outputs(exp).bugs():
        first = d.first
        if first is None:       # (a BUG has a differing request)
            continue
        mode = d.mode or "the engine's deterministic mode"
        out.append(Finding(
            "deterministic-pass-differs", "error",
            f"{d.arm}: with {mode} its outputs differ from its baseline's on {d.compared - d.identical}/{d.compared} "
            f"requests of the deterministic pass, the first at request {first.i} after {first.agreed} agreeing "
            f"{d.unit} ({d.det_arm} vs {d.det_baseline}). In this mode a greedy output depends neither on its batch "
            f"nor on speculation, so this is an engine bug, not numerics: the arm's speedup is not the same work "
            f"done faster. Report it to the engine with the two runs' outputs of request {first.i} (their bench.jsonl).",
            [f"request {q.i}: agrees with the baseline on its first {q.agreed} of {q.tokens} {d.unit}"
             for q in sorted(d.requests, key=lambda q: (q.agreed, q.i)) if not q.identical][:3]
            + [f"identical on {d.identical}/{d.compared} requests"],
            d.arm, d.runs))
    return out


RULES: dict[str, Rule] = {
    "outputs-not-valid": outputs_not_valid,
    "server-queued": server_queued,
    "deterministic-pass-differs": deterministic_pass_differs,
    "known-truth-mismatch": known_truth_mismatch,
    "known-truth-unchecked": known_truth_unchecked,
    "verify-without-cuda-graph": verify_without_cuda_graph,
    "env-not-confirmed": env_not_confirmed,
    "nccl-untuned-baseline-slow": nccl_missing_baseline_slow,
    "arms-not-like-for-like": arms_not_like_for_like,
    "accept-below-break-even": accept_below_break_even,
    "accept-length-mismatch": accept_len_mismatch,
    "gpu-throttled": gpu_throttled,
    "baseline-drift": baseline_drift,
    "client-bottleneck": client_bottleneck,
    "bursty-delivery": bursty_delivery,
    "instance-outlier": instance_outlier,
    "instance-trend": instance_trend,
    "cycle-time-unstable": cycle_time_unstable,
    "dominant-phase": dominant_phase,
    "phase-accounting": phase_accounting,
    "forced-continuation": forced_continuation,
}


def diagnose(exp: Experiment, stats: ExperimentStats | None = None, config: DoctorConfig | None = None,
             validity: validity_analysis.Validity | None = None) -> list[Finding]:
    ctx = Context(stats or analyse(exp), config or DoctorConfig(), validity)
    out = [f for rule in RULES.values() for f in rule(exp, ctx)]
    out.sort(key=lambda f: SEVERITIES.index(f.severity))
    return out
