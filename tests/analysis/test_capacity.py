"""The SLO, the capacity per block and the search's probe design (specab/analysis/measures/slo.py, capacity.py,
specab/analysis/cost/search.py) on constructed experiments whose latencies are a known function of the load."""
from __future__ import annotations

import dataclasses
import math

import pytest

from specab.analysis.cost import search as searchdesign
from specab.analysis.evidence.model import Arm, Experiment, Request, Run
from specab.analysis.measures import capacity, latency, slo as slomeasure
from specab.config import search as searchcfg, slo as slocfg

SPEC = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4}


def tpot_line(family: str, c: float) -> float:
    """A known TPOT (s) at c in flight: baseline 10 + 5 (c - 1) ms, the arm 3.26 c ms (the simulator test's lines)."""
    return (10.0 + 5.0 * (c - 1)) / 1000 if family == "baseline" else 3.26 * c / 1000


def _run(arm: str, family: str, c: float, block: int, seq: int, n: int = 12) -> Run:
    tp = tpot_line(family, c)
    reqs = [Request(i=i, start_ts=1000.0 + seq * 100 + i, output_tokens=33, ttft_s=0.01, e2e_s=0.01 + 32 * tp,
                    tpot_s=tp * (1 + 0.002 * (i - n / 2) / n), decode_tok_s=1 / tp) for i in range(n)]
    return Run(run_id=f"{seq:03d}-{arm}", arm=arm, seq=seq, block=block, requests=reqs,
               server_args={"tp_size": 1, **(SPEC if family != "baseline" else {})})


def _arms(loads: list[float]) -> list[Arm]:
    out = []
    for c in loads:
        out += [Arm(f"baseline-c{c:g}", {}, baseline=f"baseline-c{c:g}", matrix={"concurrency": int(c)}),
                Arm(f"eagle3-c{c:g}", dict(SPEC), baseline=f"baseline-c{c:g}", matrix={"concurrency": int(c)})]
    return out


class Lab:
    """An experiment grown block by block at the loads the search asks for, the latencies from tpot_line."""

    def __init__(self) -> None:
        self.exp = Experiment(id="t", arms=[], runs=[], baseline="baseline-c2")
        self.seq = 0

    def block(self, loads: list[float]) -> None:
        b = max((r.block for r in self.exp.runs), default=0) + 1
        known = {a.name for a in self.exp.arms}
        self.exp.arms += [a for a in _arms(loads) if a.name not in known]
        for c in loads:
            for fam in ("baseline", "eagle3"):
                self.seq += 1
                self.exp.runs.append(_run(f"{fam}-c{c:g}", fam, c, b, self.seq))


SLO = slocfg.Slo((slocfg.Term("tpot_ms", 50.0, 22.0),))
TRUTH = {"baseline": 3.4, "eagle3": 22.0 / 3.26}


def test_block_capacity_interpolates_the_margin_in_log_load():
    lab = Lab()
    lab.block([2, 4, 8])
    cap = capacity.analyse_capacity(lab.exp, SLO, latency.times_of(lab.exp), "concurrency")
    base = cap.families["baseline"].blocks[0]
    assert (base.passed, base.failed) == (2, 4) and base.bound.key == "tpot_ms:p50"
    m0, m1 = math.log(15 / 22), math.log(25 / 22)
    assert base.estimate == pytest.approx(2 * 2 ** (-m0 / (m1 - m0)), rel=1e-3)
    spec = cap.families["eagle3"].blocks[0]
    assert (spec.passed, spec.failed) == (4, 8) and spec.estimate == pytest.approx(TRUTH["eagle3"], rel=0.01)
    assert cap.families["eagle3"].baseline == "baseline"
    # one block: a ratio without an interval, said so
    [r] = cap.ratios
    assert r.ci is None and "one block, no interval" in r.text(SLO, "concurrency")


def test_the_search_brackets_then_narrows_to_the_capacity():
    s = searchcfg.parse("concurrency=2..8", 0.5)
    lab = Lab()
    step = searchdesign.next_block(lab.exp, s, SLO, min_blocks=3, max_blocks=6)
    assert step.more and step.loads == [2, 4, 8]                       # nothing measured yet: the ladder
    blocks = []
    while step.more:
        lab.block(step.loads)
        blocks.append(step.loads)
        step = searchdesign.next_block(lab.exp, s, SLO, min_blocks=3, max_blocks=6)
    # block 2 and 3: each configuration at the two neighbouring grid points around its estimate
    assert blocks[1:] == [[3, 4, 6, 8], [3, 4, 6, 8]] and "every configuration bracketed" in step.reason
    cap = capacity.analyse_capacity(lab.exp, SLO, latency.times_of(lab.exp), "concurrency")
    for name, fc in cap.families.items():
        assert len(fc.bracketed) == 3 and fc.estimate == pytest.approx(TRUTH[name], rel=0.01)
        assert fc.ci is not None and fc.ci.lo <= fc.estimate <= fc.ci.hi
    [r] = cap.ratios
    assert r.estimate == pytest.approx(TRUTH["eagle3"] / TRUTH["baseline"], rel=0.02) and len(r.ratios) == 3


def test_a_capacity_beyond_the_ladder_extends_it_and_stops_at_the_cap():
    s = searchcfg.parse("concurrency=1..2", 0.5)          # the arm meets the SLO at every ladder load
    lab = Lab()
    lab.block(s.ladder())
    step = searchdesign.next_block(lab.exp, s, SLO, min_blocks=2, max_blocks=2)
    assert step.more and "the ladder goes on up" in step.reason and set(step.loads) >= {4, 8}
    lab.block(step.loads)
    step = searchdesign.next_block(lab.exp, s, SLO, min_blocks=2, max_blocks=2)
    assert not step.more and "--max-repeats 2" in step.reason
    # a concurrency search probes at most as many in flight as a run measures requests: beyond that it says so
    lab = Lab()
    lab.block(s.ladder())
    step = searchdesign.next_block(lab.exp, dataclasses.replace(s, most=6), SLO, min_blocks=2, max_blocks=4)
    assert not step.more and "beyond the search's reach" in step.reason and "more than 6 requests per run" in step.reason


def test_a_request_meets_a_term_on_its_own_value_and_goodput_counts_them():
    run = _run("baseline-c4", "baseline", 4, 1, 1)
    run.requests[0].tpot_s = 0.030                         # one request beyond 22 ms, the p50 well within
    t = latency.run_times(Experiment(id="x", arms=[], runs=[run]), run)
    ev = slomeasure.evaluate(run, t, slocfg.Slo((slocfg.Term("tpot_ms", 50.0, 26.0),)))
    assert ev.met and ev.good == len(run.requests) - 1 and ev.bound.key == "tpot_ms:p50"
    w0, w1 = run.window
    assert ev.goodput == pytest.approx(ev.good / (w1 - w0))


@pytest.mark.parametrize("section, message", [
    ({"ttft": {"p95": 200}}, "unknown SLO term 'ttft' (did you mean 'ttft_ms'?)"),
    ({"ttft_ms": {"p0": 200}}, "must be p<q> with q in (0, 100]"),
    ({"ttft_ms": {"p100.5": 200}}, "must be p<q> with q in (0, 100]"),
    ({"tpot_ms": {"p95": 0}}, "must be a positive number"),
    ({"tpot_ms": {"p95": -3}}, "must be a positive number"),
    ({"tpot_ms": 10}, "must map percentiles to targets"),
])
def test_bad_slo_sections_are_refused_with_the_line(tmp_path, section, message):
    import yaml

    from specab.config.spec import load_experiment
    from specab.config.yamlfile import ConfigError
    p = tmp_path / "e.yml"
    p.write_text(yaml.safe_dump({"specab_experiment": {"name": "x", "model_path": "/m", "arms": [{"name": "b"}],
                                                       "slo": section}}))
    with pytest.raises(ConfigError) as e:
        load_experiment(p)
    assert message in str(e.value) and f"{p}:" in str(e.value) and str(e.value).split(":")[1].isdigit()


def test_slo_on_the_command_line_over_the_file():
    from specab.config.yamlfile import ConfigError
    cli = slocfg.parse_cli(["ttft_ms:p95=150", "itl_ms:p99.9=30"])
    merged = slocfg.resolve((slocfg.Term("ttft_ms", 95.0, 200.0), slocfg.Term("tpot_ms", 95.0, 10.0)), cli)
    assert [t.text() for t in merged.terms] == ["p95 TTFT <= 150 ms", "p95 TPOT <= 10 ms",
                                                "p99.9 ITL per token <= 30 ms"]
    for bad, msg in (("tpot:p95=10", "did you mean 'tpot_ms'"), ("tpot_ms=10", "TERM:pQ=TARGET"),
                     ("e2e_s:p95=x", "positive number"), ("e2e_s:p101=2", "(0, 100]")):
        with pytest.raises(ConfigError, match=re_escape(msg)):
            slocfg.parse_cli([bad])


def re_escape(s: str) -> str:
    import re
    return re.escape(s)


def test_the_report_section_and_the_throughput_per_gpu_plot(monkeypatch):
    """The section's capacity table and verdict, and the plot: per configuration one line over its loads through the
    median per-user tok/s and the median output tok/s per GPU of its runs there, hollow where the load missed the SLO,
    the legend beside the axes."""
    from statistics import median

    from specab.analysis.cost.economics import gpus_of
    from specab.analysis.render import capacity as render
    from specab.analysis.render.document import Report, to_markdown
    drawn = []
    to_png = render._fig_png

    def keep(fig):
        fig.draw_without_rendering()
        drawn.append(fig)
        return to_png(fig)
    monkeypatch.setattr(render, "_fig_png", keep)
    lab = Lab()
    lab.block([2, 4, 8])
    lab.block([3, 4, 6, 8])
    lab.exp.meta = {"config": {"slo": {"tpot_ms": {"p50": 22}}}, "argv": ["--search", "concurrency=2..8"]}
    rep = Report("t")
    data = render.capacity_section(rep, lab.exp, opts=render.CapacityOptions(gpu_hour_usd=2.0))
    md = to_markdown(rep)
    assert "## SLO and capacity" in md and "at p50 TPOT <= 22 ms, eagle3 serves" in md
    per_gpu = data["cost"]["eagle3"]["per_gpu_tok_s_at_capacity"]
    assert data["cost"]["eagle3"]["usd_per_million_output_tokens"] == pytest.approx(2.0 * 1e6 / 3600 / per_gpu)
    [fig] = drawn
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) >= {"baseline", "eagle3", "missed the SLO"}
    ax_legend = ax.get_legend().get_window_extent()
    assert ax_legend.x0 >= ax.get_window_extent().x1
    joined = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 1]
    for fam, line in zip(("baseline", "eagle3"), joined):
        runs = {}
        for r in lab.exp.runs:
            if r.arm.startswith(fam):
                runs.setdefault(lab.exp.arm(r.arm).matrix["concurrency"], []).append(r)
        want = [(median(r.tok_s for r in rs), median(r.throughput / gpus_of(r.server_args) for r in rs))
                for _, rs in sorted(runs.items())]
        assert list(zip(line.get_xdata(), line.get_ydata())) == pytest.approx(want)


def test_per_token_itl_is_recomputed_from_the_stores_chunk_arrays(tmp_path):
    """A store written before the client recorded itl_token_s (no run directory left either): the analysis spreads
    each stored chunk's gap over its tokens, in simulated seconds on a time-scaled node."""
    from tests.analysis import factory as F

    from specab.analysis.evidence.model import load_store
    from specab.results.store import FILENAME, Store
    exp = F.experiment({"baseline": 100.0, "eagle3-s2": 150.0}, blocks=1)
    root = F.write_store(exp, tmp_path, time_scale=2.0)
    chunks = ([0.010, 0.012, 0.018, 0.020], [1, 1, 3, 1])       # wall seconds since send, tokens per chunk
    with Store.open(root / FILENAME) as store:
        recs = [dict(r, chunk_t_s=list(chunks[0]), chunk_tokens=list(chunks[1]), warmup=r["warmup"])
                for r in store.requests(seq=1, include_warmup=True)]
        store.add_requests(1, recs[0]["host"], recs)
    for d in root.iterdir():
        if d.is_dir():
            for f in d.glob("bench.jsonl"):
                f.unlink()
    stored = load_store(root)
    run = next(r for r in stored.runs if r.seq == 1)
    t = latency.run_times(stored, run)
    per_request = [0.002 * 2, 0.002 * 2, 0.002 * 2, 0.002 * 2, 0.002 * 2]   # 2 ms, 3 x 2 ms, 2 ms: x scale 2
    assert all(r.itl_token_s == pytest.approx(per_request) for r in t.requests) and len(t.requests) == 8
    assert t.percentile("itl_chunk_s", 50) == pytest.approx(0.004)


def test_a_block_with_one_capacity_censored_bounds_the_ratio_from_one_side():
    """Per block the two capacities' spans give the ratio's range: the arm above its highest probe against the
    baseline's estimate is at least their ratio, the arm below its first miss at most; both censored the same way
    bound nothing; the verdict lists the bounds and says when all of them lie against the paired estimate."""
    B = capacity.BlockCapacity
    arm = capacity.FamilyCapacity("eagle3", "baseline", [
        B(1, [], estimate=6.0), B(2, [], passed=8.0, censored="above"), B(3, [], failed=4.0, censored="below"),
        B(4, [], passed=8.0, censored="above"), B(5, [], estimate=5.0)])
    base = capacity.FamilyCapacity("baseline", None, [
        B(1, [], estimate=3.0), B(2, [], estimate=4.0), B(3, [], estimate=5.0),
        B(4, [], passed=6.0, censored="above"), B(5, [], failed=2.0, censored="below")])
    assert capacity.one_sided(arm, base, {1}) == [(2, 2.0, math.inf), (3, 0.0, 0.8), (5, 2.5, math.inf)]
    ratio = capacity.CapacityRatio("eagle3", "baseline", [0.5], [1], None, capacity.one_sided(arm, base, {1}))
    text = ratio.text(SLO, "concurrency")
    assert text.endswith("from one side: >= 2.00x (block 2), <= 0.80x (block 3), >= 2.50x (block 5)")
    ratio.bounds = [(2, 2.0, math.inf), (5, 2.5, math.inf)]
    assert text != (t2 := ratio.text(SLO, "concurrency")) and t2.endswith("all against the estimate: the paired "
                                                                          "blocks do not decide it")


def test_the_term_that_bound_a_family_names_each_term_where_its_blocks_differ():
    B, T = capacity.BlockCapacity, slocfg.Term
    tpot, ttft = T("tpot_ms", 95.0, 4.0), T("ttft_ms", 95.0, 200.0)
    fc = capacity.FamilyCapacity("eagle3", "baseline", [B(1, [], estimate=6.0, bound=tpot),
                                                        B(2, [], estimate=5.0, bound=ttft)])
    assert fc.bound_text() == "p95 TPOT <= 4 ms (1 of 2 blocks), p95 TTFT <= 200 ms (1 of 2 blocks)"
    fc.blocks.append(B(3, [], estimate=5.5, bound=ttft))
    assert fc.bound_text() == "p95 TTFT <= 200 ms (2 of 3 blocks), p95 TPOT <= 4 ms (1 of 3 blocks)"
    fc.blocks[:2] = [B(1, [], estimate=6.0, bound=ttft), B(2, [], passed=8.0, censored="above")]
    assert fc.bound_text() == "p95 TTFT <= 200 ms"
