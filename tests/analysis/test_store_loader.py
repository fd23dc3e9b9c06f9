"""The analysis reads an experiment back from the driver's results store (docs/results.md)."""
import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.findings import doctor
from specab.analysis.measures import stats
from tests.analysis import factory as F


def test_store_round_trip_gives_the_same_statistics(tmp_path):
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, accept={"eagle3-s2": 2.1})
    d = F.write_store(exp, tmp_path)
    back = analysis.load_store(d)
    assert back.id == exp.id and back.order == "interleaved" and back.baseline == "baseline"
    assert [a.name for a in back.spec_arms] == ["eagle3-s2"]
    assert back.target_ci == pytest.approx(0.02) and back.max_repeats == 8
    assert len(back.runs) == 8 and all(r.ok for r in back.runs)
    r0 = back.runs[0]
    assert r0.server_args["tp_size"] == 8 and "internal_states" not in r0.server_args
    assert r0.env_check and r0.env_check.variables and all(v.confirmed for v in r0.env_check.variables)
    assert r0.gpu_samples and r0.gpu_samples[0].reasons == 0 and r0.gpu_samples[0].max_sm_mhz == 1980
    assert r0.log and r0.log.cuda_graph_true == 6 and r0.log.cuda_graph_share == 1.0
    assert r0.log.nccl_env.get("NCCL_MAX_NCHANNELS") == "16"
    a, b = stats.paired_speedup(exp, "eagle3-s2"), stats.paired_speedup(back, "eagle3-s2")
    assert b.ratios == pytest.approx(a.ratios)
    s = stats.arm_stats(back, "eagle3-s2")
    assert s.accept_len.mean == pytest.approx(2.1, rel=0.02) and s.log_accept_len == pytest.approx(2.1)
    assert not s.accept_len_disagrees
    assert {f.rule for f in doctor.diagnose(back)} == {"accept-below-break-even"}


def test_store_env_check_mismatch_reaches_the_doctor(tmp_path):
    def lost(run, arm):
        if arm.is_spec:
            run.env_check = F.env_check(run.env, missing_in_workers=("NCCL_ALGO",))
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 94.0}, blocks=3, tweak=lost)
    back = analysis.load_store(F.write_store(exp, tmp_path))
    f = [x for x in doctor.diagnose(back) if x.rule == "env-not-confirmed"]
    assert len(f) == 1 and "NCCL_ALGO" in f[0].message


def test_missing_store_is_an_actionable_error(tmp_path):
    with pytest.raises(analysis.AnalysisError, match="no results store"):
        analysis.load_store(tmp_path)


def test_simulated_time_scale_is_undone(tmp_path):
    """A simulated node at SPECAB_SIM_TIME_SCALE=20 runs 20x fast: the analysis reports simulated seconds."""
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, accept={"eagle3-s2": 2.1})
    back = analysis.load_store(F.write_store(exp, tmp_path, time_scale=20.0))
    assert back.meta["time_scales"] == [20.0] and all(r.time_scale == 20.0 for r in back.runs)
    for a, b in zip(exp.runs, back.runs):
        assert b.tok_s == pytest.approx(a.tok_s) and b.measured[0].tpot_s == pytest.approx(a.measured[0].tpot_s)
    assert back.runs[0].log.gen_tok_s_median == pytest.approx(exp.runs[0].log.gen_tok_s_median / 20, rel=1e-3)


# ------------------------------------------------------------------ the lean loader (benchmarks 5/6)

def _dict_loader(d):
    """The loader before it streamed tuples: every row as a dict, uuid decoded from raw_json."""
    import json

    from specab.results.store import Store
    s = Store.open(d)
    try:
        reqs, samples = {}, {}
        for r in s.requests(include_warmup=True):
            reqs.setdefault(r["seq"], []).append(analysis.Request.from_json(r))
        for g in s.gpu_samples():
            if g.get("ts") is None:
                continue
            samples.setdefault(g["seq"], []).append(analysis.GpuSample(
                ts=g["ts"], index=int(g.get("gpu") or 0), uuid=json.loads(g["raw_json"]).get("uuid"),
                sm_mhz=g.get("sm_clock_mhz"), max_sm_mhz=g.get("max_sm_clock_mhz"), util_pct=g.get("util_pct"),
                reasons=analysis._reasons(g.get("throttle_reasons")), host=g.get("host")))
        return reqs, samples
    finally:
        s.close()


CSV = ("timestamp,index,uuid,clocks.sm [MHz],clocks.max.sm [MHz],power.draw [W],clocks_event_reasons.active\n"
       "100.0,0,GPU-a,1980,1980,455.5,0x0000000000000000\n"
       "100.0,1,GPU-b,1980,1980,-0.0,0x0000000000000000\n"
       "99.0,0,GPU-a,1500,1980,300,0x0000000000000020\n"        # out of order: the loader sorts by time
       "99.0,1,GPU-b,,1980,N/A,\n"
       ",0,GPU-a,1980,1980,1,0x0\n"                               # no timestamp: skipped
       "101.0,0,,1980,1980,455.5,0x1\n")


def _store_with_samples(tmp_path):
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=2, accept={"eagle3-s2": 2.1})
    d = F.write_store(exp, tmp_path)
    return exp, d


def test_lean_loader_gives_what_the_dict_loader_gave(tmp_path):
    from specab.results.store import Store
    _, d = _store_with_samples(tmp_path)
    with Store.open(d) as s:
        s.add_gpu_samples(1, "localhost", CSV)
    reqs, samples = _dict_loader(d)
    back = analysis.load_store(d)
    for r in back.runs:
        assert r.requests == reqs.get(r.seq, [])
        assert r.gpu_samples == sorted(samples.get(r.seq, []), key=lambda g: g.ts)
    s1 = back.runs[0].gpu_samples
    assert [g.ts for g in s1] == sorted(g.ts for g in s1)
    added = [g for g in s1 if g.ts in (99.0, 100.0, 101.0)]
    assert [(g.ts, g.index, g.uuid) for g in added] == [(99.0, 0, "GPU-a"), (99.0, 1, "GPU-b"), (100.0, 0, "GPU-a"),
                                                        (100.0, 1, "GPU-b"), (101.0, 0, "")]
    assert added[0].reasons == 0x20 and added[1].sm_mhz is None
    with Store.open(d) as s:
        assert [g["power_w"] for g in s.gpu_samples() if g["ts"] == 99.0 and g["gpu"] == 1] == [None]     # N/A


def test_store_of_before_the_uuid_column_reads_and_resumes(tmp_path):
    """A results store written before gpu_samples.uuid existed still reports, and a
    resumed experiment adds the column on its first write; uuids come from raw_json for the old rows."""
    import sqlite3

    from specab.analysis.render import report
    from specab.results.store import Store
    exp, d = _store_with_samples(tmp_path)
    con = sqlite3.connect(d / "results.sqlite")
    con.execute("ALTER TABLE gpu_samples DROP COLUMN uuid")
    con.execute("UPDATE gpu_samples SET raw_json = json_set(raw_json, '$.uuid', 'GPU-old-' || gpu)")
    con.commit()
    con.close()
    old = analysis.load_store(d)
    assert old.runs[0].gpu_samples[0].uuid == "GPU-old-0"
    paths = report.write_report(d)
    assert "## Speedup (paired within blocks)" in open(paths["markdown"]).read()
    with Store.open(d) as s:                        # resume: the next run's samples
        s.add_gpu_samples(2, "localhost", CSV)
        assert "uuid" in {r[1] for r in s.conn.execute("PRAGMA table_info(gpu_samples)")}
    back = analysis.load_store(d)
    uuids = {g.uuid for g in back.runs[1].gpu_samples}
    assert {"GPU-old-0", "GPU-old-1", "GPU-a", "GPU-b", ""} <= uuids
    reqs, samples = _dict_loader(d)
    for r in back.runs:
        assert r.gpu_samples == sorted(samples.get(r.seq, []), key=lambda g: g.ts)


def test_two_connections_to_an_old_store_both_add_samples(tmp_path):
    """A fleet writes one store from several Store objects: both see no uuid column, the second ALTER
    finds it added already and goes on."""
    import sqlite3

    from specab.results.store import Store
    _, d = _store_with_samples(tmp_path)
    con = sqlite3.connect(d / "results.sqlite")
    con.execute("ALTER TABLE gpu_samples DROP COLUMN uuid")
    con.commit()
    con.close()
    a, b = Store.open(d), Store.open(d)
    try:
        assert not a._has_gpu_uuid_column() and not b._has_gpu_uuid_column()
        assert a.add_gpu_samples(1, "localhost", CSV) == 6          # every data row (one has no timestamp)
        assert b.add_gpu_samples(2, "localhost", CSV) == 6
    finally:
        a.close()
        b.close()
    back = analysis.load_store(d)
    assert {g.uuid for r in back.runs[:2] for g in r.gpu_samples} >= {"GPU-a", "GPU-b"}


@pytest.mark.parametrize("uuid_column", [True, False])
def test_sqlite_without_json1_reads_the_same_samples(tmp_path, monkeypatch, uuid_column):
    import sqlite3

    from specab.results.store import Store
    _, d = _store_with_samples(tmp_path)
    with Store.open(d) as s:
        s.add_gpu_samples(1, "localhost", CSV)
    if not uuid_column:
        con = sqlite3.connect(d / "results.sqlite")
        con.execute("ALTER TABLE gpu_samples DROP COLUMN uuid")
        con.commit()
        con.close()
    with Store.open(d) as s:
        want = list(s.gpu_sample_rows())
        real = Store._tuples

        def no_json1(self, sql):
            if "json_extract" in sql:
                raise sqlite3.OperationalError("no such function: json_extract")
            return real(self, sql)
        monkeypatch.setattr(Store, "_tuples", no_json1)
        assert list(s.gpu_sample_rows()) == want
    assert any(row[-1] == "GPU-a" for row in want)


def test_a_samples_csv_reads_the_same_into_the_store_and_from_the_run_directory(tmp_path):
    """The store and a run directory's gpu_samples.csv are read by one reader: a column named twice (the first
    counts) and the line a stopped sampler was writing (no sample) give the same samples on both sides."""
    from specab.results.store import Store
    text = ("timestamp,index,clocks.sm [MHz],clocks.current.sm [MHz],clocks_event_reasons.active\n"
            "10.0,0,1980,1500,0x0\n"
            "11.0,0,1410,1200,0x20\n"
            "12.0,0,19")                                   # cut mid-line
    path = tmp_path / "gpu_samples.csv"
    path.write_text(text)
    direct = analysis.read_gpu_samples(path)
    assert [(g.ts, g.sm_mhz, g.reasons) for g in direct] == [(10.0, 1980, 0), (11.0, 1410, 0x20)]
    _, d = _store_with_samples(tmp_path / "store")
    with Store.open(d) as s:
        assert s.add_gpu_samples(1, "localhost", text) == 2
        stored = [(g["ts"], g["sm_clock_mhz"]) for g in s.gpu_samples(1) if g["ts"] in (10.0, 11.0, 12.0)]
    assert stored == [(g.ts, g.sm_mhz) for g in direct]


def test_a_burn_in_run_is_loaded_apart_from_the_measured_runs(tmp_path):
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, accept={"eagle3-s2": 2.1})
    d = F.write_store(exp, tmp_path)
    from specab.results.store import Store
    with Store.open(d) as s:
        s.conn.execute("UPDATE plan SET burn_in = 1 WHERE seq = 1")      # as make_plan(burn_in=1) writes it
        s.conn.commit()
    back = analysis.load_store(d)
    assert [r.run_id for r in back.burn_in] == [exp.runs[0].run_id] and back.burn_in[0].ok
    assert [r.seq for r in back.runs] == [r.seq for r in exp.runs[1:]]
    assert stats.analyse(back).arms[exp.runs[0].arm].runs == 2
