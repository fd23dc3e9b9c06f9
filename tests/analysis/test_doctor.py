"""Every doctor rule fires on data that provokes it, quotes its evidence, and stays silent on a clean run."""
import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.findings import doctor
from specab.analysis.measures import stats
from tests.analysis import factory as F

CLEAN = {"baseline": 82.2, "eagle3-s2": 94.0}      # EAGLE wins at tau 2.1: nothing to report


def fired(exp, rule, **cfg):
    return [f for f in doctor.diagnose(exp, config=doctor.DoctorConfig(**cfg)) if f.rule == rule]


def clean(**kw):
    return F.experiment(CLEAN, blocks=5, accept={"eagle3-s2": 2.1}, **kw)


def test_clean_experiment_has_no_findings():
    assert doctor.diagnose(clean(), config=doctor.DoctorConfig(usual_baseline_tok_s=82.0)) == []


@pytest.mark.parametrize("rule", sorted(doctor.RULES))
def test_every_rule_is_silent_on_clean_data(rule):
    assert fired(clean(), rule, usual_baseline_tok_s=82.0) == []


def test_verify_without_cuda_graph():
    def no_graph(run, arm):
        if arm.is_spec:
            run.log = F.log_stats(True, 2.1, 60.5, cuda_graph=False)
    f = fired(clean(tweak=no_graph), "verify-without-cuda-graph")
    assert len(f) == 1 and f[0].arm == "eagle3-s2"
    assert any("cuda graph: False" in e for e in f[0].evidence)
    assert "--disable-cuda-graph" in f[0].message


def test_env_not_confirmed_in_workers():
    def lost(run, arm):
        if arm.is_spec and run.block == 1:
            run.env_check = F.env_check(run.env, missing_in_workers=("NCCL_PROTO",))
    f = fired(clean(tweak=lost), "env-not-confirmed")
    assert len(f) == 1 and f[0].severity == "error" and "NCCL_PROTO" in f[0].message
    assert any("sglang::scheduler_TP0" in e for e in f[0].evidence)


def test_nccl_missing_and_baseline_slower_than_usual():
    def untuned(run, arm):
        if not arm.is_spec:
            run.env = {}
            run.env_check = F.env_check({})
    exp = F.experiment({"baseline": 63.0, "eagle3-s2": 94.0}, blocks=4, tweak=untuned)
    f = fired(exp, "nccl-untuned-baseline-slow", usual_baseline_tok_s=82.2)
    assert len(f) == 1 and f[0].severity == "warning"
    assert "NCCL_PROTO" in f[0].message and "slower than usual" in f[0].message
    # tuned and normal speed: silent; untuned but at the usual speed: silent
    assert fired(exp, "nccl-untuned-baseline-slow", usual_baseline_tok_s=64.0) == []


def test_arms_not_like_for_like():
    def sglang_defaults(run, arm):
        if not arm.is_spec:      # what /get_server_info shows for a plain baseline
            run.server_args = {**run.server_args, "max_running_requests": 4096, "disable_overlap_schedule": False}
    f = fired(clean(tweak=sglang_defaults), "arms-not-like-for-like")
    assert len(f) == 1
    assert "max_running_requests: baseline=4096, eagle3-s2=48" in f[0].evidence
    assert "--max-running-requests" in f[0].message and "--disable-overlap-schedule" in f[0].message


@pytest.mark.parametrize("load,severity", [(1, "info"), (2, "info"), (3, "warning"), (8, "warning")])
def test_graph_batch_sizes_that_differ_above_the_load_are_an_info_not_a_confound(load: int, severity: str):
    """SGLang 0.5.17 captures graphs at [1, 2, 3, 4, 5, ...] for a speculative server and [1, 2, 4, 8, ...] for a
    plain one. At 1 or 2 in flight every batch runs the same graph in both arms; at 3 the baseline pads its batch of
    3 to the graph of 4 while the speculative arm has one of 3: that A/B is not like for like."""
    def graphs(run, arm):
        run.server_args = {**run.server_args, "cuda_graph_bs": [1, 2, 3, 4, 5, 6, 7, 8] if arm.is_spec
                           else [1, 2, 4, 8]}
    exp = clean(tweak=graphs)
    exp.meta["config"] = {"bench": {"concurrency": load}}
    (f,) = fired(exp, "arms-not-like-for-like")
    assert f.severity == severity and "(cuda_graph_bs)" in f.message, f.message
    assert "cuda_graph_bs: baseline=[1, 2, 4, 8], eagle3-s2=[1, 2, 3, 4, 5, 6, 7, 8]" in f.evidence
    if severity == "info":
        assert "so this A/B is like for like" in f.message and "At higher loads it would not be" in f.message
    else:
        assert "is not like for like" in f.message
    # a list not read back (the engine's default unknown) is judged a difference, at any load
    exp.runs[0].server_args = {k: v for k, v in exp.runs[0].server_args.items() if k != "cuda_graph_bs"}
    assert [g.severity for g in fired(exp, "arms-not-like-for-like")] == ["warning"]


def test_accept_length_below_break_even_on_the_seed_numbers():
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, accept={"eagle3-s2": 2.1})
    f = fired(exp, "accept-below-break-even")
    assert len(f) == 1
    assert "break-even 2.8" in f[0].message                     # tau* ~ 2.85
    assert "loses" in f[0].message and "conditional acceptance" in f[0].message


def test_gpu_throttle_reasons_and_clock_drop():
    def hot(run, arm):
        if run.block == 2 and not arm.is_spec:
            w = run.window
            run.gpu_samples = F.gpu_samples(w[0], w[1], sm=1500, max_sm=1980, reasons=0x20 | 0x4)
    f = fired(clean(tweak=hot), "gpu-throttled")
    assert len(f) == 1 and f[0].runs[0].endswith("-baseline")
    assert any("SwThermalSlowdown" in e and "SwPowerCap" in e for e in f[0].evidence)
    assert any("1500 MHz vs 1980 MHz" in e for e in f[0].evidence)


def test_idle_reason_outside_the_window_is_not_throttling():
    def idle(run, arm):
        w = run.window
        run.gpu_samples += F.gpu_samples(w[1] + 5, w[1] + 30, sm=345, max_sm=1980, reasons=0x1)
        run.gpu_samples += F.gpu_samples(w[0], w[1], sm=345, max_sm=1980, reasons=0x1)   # idle between requests
    assert fired(clean(tweak=idle), "gpu-throttled") == []


def test_baseline_drift_and_blocked_exposure():
    exp = F.experiment(CLEAN, blocks=8, accept={"eagle3-s2": 2.1}, drift_per_run=-0.005, run_cv=0.003)
    f = fired(exp, "baseline-drift")
    assert len(f) == 1 and "drifted" in f[0].message
    blocked = F.experiment(CLEAN, blocks=8, accept={"eagle3-s2": 2.1}, drift_per_run=-0.005, order="blocked")
    f = fired(blocked, "baseline-drift")
    assert "--order interleaved" in f[0].message


def test_a_trend_beyond_noise_but_under_two_percent_is_not_a_warning():
    # 8 blocks, -0.1 % per run (-1.5 % over the experiment), almost no run noise: statistically clear, too
    # small to move a verdict at the usual 2 % precision (and with 3 runs, 1 experiment in 20 is "beyond
    # noise" by chance)
    exp = F.experiment(CLEAN, blocks=8, accept={"eagle3-s2": 2.1}, drift_per_run=-0.001, run_cv=0.0005)
    d = stats.analyse(exp).drift
    assert d.beyond_noise and -0.02 < d.change_rel < -0.01, d.message
    assert fired(exp, "baseline-drift") == []
    blocked = F.experiment(CLEAN, blocks=8, accept={"eagle3-s2": 2.1}, drift_per_run=-0.001, run_cv=0.0005,
                           order="blocked")
    assert fired(blocked, "baseline-drift") == [] and len(fired(blocked, "blocked-order")) == 1


def test_a_run_the_client_could_not_time_takes_the_engines_rate_and_the_doctor_says_how_far_they_agree():
    """A baseline run whose every measured request reached the client in bursts has no client pace; where the
    engine reported its own decode rate over the same requests (vLLM's /metrics) that is the run's tok/s, the paired
    speedup of its block stands, and bursty-delivery names the run and the agreement on the runs with both."""
    def starved(run, arm):
        if not arm.is_spec:
            run.engine_tok_s = run.tok_s * 1.01            # the engine's rate on every baseline run: +1 %
        if run.block == 2 and not arm.is_spec:
            for r in run.measured:
                r.decode_tok_s = None
            run.buffered_requests = len(run.measured)
    exp = clean(tweak=starved)
    lost = next(r for r in exp.runs if r.block == 2 and r.arm == "baseline")
    assert lost.tok_s_source == "engine" and lost.tok_s == lost.engine_tok_s
    assert all(r.tok_s_source == "client" for r in exp.runs if r is not lost)
    assert len(stats.paired_speedup(exp, "eagle3-s2").ratios) == 5          # the block keeps its pair
    f = fired(exp, "bursty-delivery")
    assert len(f) == 1 and f[0].severity == "info" and f[0].runs == [lost.run_id]
    assert (f"{lost.run_id} had no request the client could time: their tok/s is the engine's own decode rate"
            in f[0].message)
    assert "on the 4 runs where both were measured the engine's rate was +1.0 % to +1.0 % of the client's" \
        in f[0].message
    assert f[0].evidence == [f"{lost.run_id}: {len(lost.measured)} of {len(lost.measured)} requests in bursts; "
                             f"tok/s {lost.tok_s:.1f} from the engine"]

    def no_engine(run, arm):
        starved(run, arm)
        run.engine_tok_s = None
    exp = clean(tweak=no_engine)
    lost = next(r for r in exp.runs if r.block == 2 and r.arm == "baseline")
    assert lost.tok_s is None and lost.tok_s_source is None
    assert len(stats.paired_speedup(exp, "eagle3-s2").ratios) == 4
    assert "engine's own decode rate" not in fired(exp, "bursty-delivery")[0].message


def test_client_bottleneck():
    def busy_client(run, arm):
        if run.block == 0 and arm.is_spec:
            run.client_cpu_s = run.duration_s * 0.97
    f = fired(clean(tweak=busy_client), "client-bottleneck")
    assert len(f) == 1 and "97% of a core" in f[0].evidence[0]

    def lagging(run, arm):
        if run.block == 3 and not arm.is_spec:
            run.log.gen_tok_s_median = run.tok_s * 1.5
    f = fired(clean(tweak=lagging), "client-bottleneck")
    assert len(f) == 1 and "server logged gen throughput" in f[0].evidence[0]


def test_client_bottleneck_is_judged_by_the_busiest_client_process():
    """Four client processes at 40 % of a core each (160 % together) are no bottleneck; one of them at 95 % is, and
    the evidence names the busiest process and the total."""
    def spread(run, arm):
        if run.block == 0 and arm.is_spec:
            run.client_procs = 4
            run.client_cpu_s, run.client_cpu_max_proc_s = run.duration_s * 1.6, run.duration_s * 0.4
    assert fired(clean(tweak=spread), "client-bottleneck") == []

    def one_saturated(run, arm):
        if run.block == 0 and arm.is_spec:
            run.client_procs = 4
            run.client_cpu_s, run.client_cpu_max_proc_s = run.duration_s * 1.6, run.duration_s * 0.95
    f = fired(clean(tweak=one_saturated), "client-bottleneck")
    assert len(f) == 1 and "busiest of 4 client processes" in f[0].evidence[0] and "95% of a core" in f[0].evidence[0]
    assert "bench.client_procs, now 4" in f[0].message


def test_a_summary_from_before_client_processes_is_judged_by_its_one_process(tmp_path):
    """model reads the busiest process's CPU from the summary, and from client_cpu_s where a summary has no
    client_cpu_max_proc_s (the client ran one process)."""
    from specab.analysis.evidence import model
    assert model._client_cpu_max_proc_s({"client_cpu_s": 9.5}) == 9.5 and model._client_procs({}) == 1
    assert model._client_cpu_max_proc_s({"client_cpu_s": 9.5, "client_cpu_max_proc_s": 3.0}) == 3.0
    assert model._client_procs({"client_procs": 4}) == 4


def test_instance_outlier():
    def slow_instance(run, arm):
        if run.block == 3 and arm.is_spec:
            for q in run.requests:
                q.decode_tok_s *= 0.8
    f = fired(clean(tweak=slow_instance), "instance-outlier")
    assert len(f) == 1 and "-19%" in f[0].message and f[0].arm == "eagle3-s2"


def test_accept_length_from_requests_disagreeing_with_the_log():
    def other_traffic(run, arm):
        if arm.is_spec:
            run.log.accept_len_mean = 2.6
    f = fired(clean(tweak=other_traffic), "accept-length-mismatch")
    assert len(f) == 1 and "2.10" in f[0].message and "2.60" in f[0].message


def test_client_vs_server_is_compared_per_request_at_any_concurrency(tmp_path):
    """The server's gen throughput is the whole batch's: at concurrency 4 a healthy client reads a
    quarter of it per request. The rule divides each log line by its #running-req (read from the run's
    server.log by the real parser), or, for a log without running counts, the median by the concurrency."""
    line = ("[2026-11-29 10:41:51 TP0] Decode batch, #running-req: {n}, #token: 1696, token usage: 0.00, "
            "cuda graph: True, gen throughput (token/s): {gen:.2f}, #queue-req: 0\n")

    def batch_of_4(run, arm):
        log = tmp_path / f"{id(run)}-server.log"
        log.write_text("".join(line.format(n=4, gen=4 * run.tok_s) for _ in range(5)) + line.format(n=1, gen=run.tok_s))
        run.log = analysis.parse_server_log(log)
    exp = clean(tweak=batch_of_4)
    assert all(r.log.gen_tok_s_median == pytest.approx(4 * r.tok_s, rel=0.01) for r in exp.runs)
    assert fired(exp, "client-bottleneck") == []
    for r in exp.runs:                         # no running counts: the client's concurrency from the experiment
        r.log.gen_tok_s_per_req_median = None
    exp.meta["config"] = {"bench": {"concurrency": 4}}
    assert fired(exp, "client-bottleneck") == []
    exp.meta["config"] = {"bench": {"concurrency": 1}}
    assert len(fired(exp, "client-bottleneck")) == len(exp.runs)   # the batch's rate is not one request's

    def lagging_at_4(run, arm):
        batch_of_4(run, arm)
        if run.block == 2 and arm.is_spec:
            for q in run.requests:
                q.decode_tok_s *= 0.6
    f = fired(clean(tweak=lagging_at_4), "client-bottleneck")
    assert len(f) == 1 and "per running request" in f[0].evidence[0] and "#running-req" in f[0].evidence[0]


def test_short_outputs_explain_an_accept_length_mismatch():
    """SGLang's per-request accept length is completion_tokens / spec_verify_ct: the prefill token has no
    verify step, so with L output tokens it reads L/(L-1) above the log's per-step mean."""
    def short(run, arm):
        if arm.is_spec:
            for q in run.requests:
                q.output_tokens = 12
                q.spec_verify_ct = 5
            run.log.accept_len_mean = 11 / 5
    f = fired(clean(tweak=short), "accept-length-mismatch")
    assert len(f) == 1 and "prefill" in f[0].message and "longer outputs" in f[0].message
    assert any("12 output tokens" in e and "1.091x" in e for e in f[0].evidence), f[0].evidence


def _flags_0523() -> frozenset:
    from pathlib import Path

    from specab.driver.preflight import parse_help_flags
    help_text = (Path(__file__).resolve().parents[2] / "specab/sim/data/sglang-0.5.23-help.txt").read_text()
    return frozenset(parse_help_flags(help_text))


def _as_0523(run, arm):
    """The /server_info readback of SGLang 0.5.23: no cuda_graph_max_bs key, cuda_graph_config per phase."""
    args = {k: v for k, v in run.server_args.items() if k not in ("cuda_graph_max_bs", "cuda_graph_bs")}
    args["cuda_graph_config"] = {"decode": {"backend": "full", "max_bs": 48, "bs": [1, 2, 4]}}
    args["disable_overlap_schedule"] = False
    run.server_args = args


def _flags_named(text: str) -> set:
    import re
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def test_doctor_advice_on_0523_names_only_flags_the_node_has():
    """On 0.5.23 the advice names per-phase graph flags and knows overlap stays on under spec."""
    flags = _flags_0523()

    def no_graph(run, arm):
        _as_0523(run, arm)
        if arm.is_spec:
            run.log = F.log_stats(True, 2.1, 60.5, cuda_graph=False)
    (g,) = fired(clean(tweak=no_graph), "verify-without-cuda-graph")
    assert "--cuda-graph-max-bs-decode" in g.message and _flags_named(g.message) <= flags, g.message

    def differ(run, arm):
        _as_0523(run, arm)
        if not arm.is_spec:
            run.server_args = {**run.server_args, "max_running_requests": 4096,
                               "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 160, "bs": [1]}}}
    exp = clean(tweak=differ)
    exp.meta["config"] = {"bench": {"concurrency": 4}}      # batches of 2-4: graphed in one arm, eager in the other
    (f,) = fired(exp, "arms-not-like-for-like")
    assert f.severity == "warning" and "cuda_graph_bs: baseline=[1], eagle3-s2=[1, 2, 4]" in f.evidence
    # both capture every batch of up to 4 under their max_bs (160, 48): not a difference this A/B met
    assert "alike at up to 4 in flight (every batch ran the same graph in each arm): cuda_graph_max_bs" in f.evidence
    assert "--cuda-graph-bs-decode" in f.message and "--cuda-graph-max-bs" not in f.message
    # each reason is what SGLang changed for the speculative arm; 0.5.23 keeps the overlap scheduler on under
    # speculation, so the finding does not claim it off
    assert "caps a speculative server at max_running_requests=48" in f.message
    assert "captures CUDA graphs at other batch sizes" in f.message and "overlap scheduler" not in f.message
    assert _flags_named(f.message) <= flags, f.message
    # the same data read back from 0.5.9 keeps the 0.5.9 advice
    (old,) = fired(clean(tweak=lambda run, arm: setattr(run, "log", F.log_stats(True, 2.1, 60.5, cuda_graph=False))
                         if arm.is_spec else None), "verify-without-cuda-graph")
    assert "--disable-cuda-graph" in old.message


def test_engine_builds_are_judged_each_against_their_own_baseline_and_generation():
    """Engine axis: two builds' arms differ on purpose (0.5.9 vs 0.5.23 readback); like-for-like is
    judged within each build's group, and each spec arm's advice is spelt for its own build."""
    from specab.analysis.evidence.model import Arm
    arm_list = [Arm("baseline-old", dict(F.BASE_ARGS), dict(F.TUNED), baseline="baseline-old"),
                Arm("eagle3-s2-old", F.spec_args(2), dict(F.TUNED), baseline="baseline-old"),
                Arm("baseline-new", dict(F.BASE_ARGS), dict(F.TUNED), baseline="baseline-new"),
                Arm("eagle3-s2-new", F.spec_args(2), dict(F.TUNED), baseline="baseline-new")]

    def tweak(run, arm):
        if arm.name.endswith("-new"):
            _as_0523(run, arm)
        if arm.is_spec:
            run.log = F.log_stats(True, 2.1, 60.5, cuda_graph=False)
    exp = F.experiment({"baseline-old": 82.0, "eagle3-s2-old": 60.0, "baseline-new": 82.0, "eagle3-s2-new": 60.0},
                       blocks=4, arm_list=arm_list, tweak=tweak)
    assert fired(exp, "arms-not-like-for-like") == []       # the builds differ, each build's arms do not
    graph = {f.arm: f.message for f in fired(exp, "verify-without-cuda-graph")}
    assert "--disable-cuda-graph" in graph["eagle3-s2-old"] and "--cuda-graph-max-bs " in graph["eagle3-s2-old"]
    assert "--cuda-graph-max-bs-decode" in graph["eagle3-s2-new"] and "--disable-cuda-graph" not in graph["eagle3-s2-new"]
