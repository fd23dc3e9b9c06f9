"""The results store: written as results arrive, read back by the analysis, missing runs for --resume."""
from __future__ import annotations

import json

import pytest

from specab.results import store as st
from specab.config.plan import make_plan


def _store(tmp_path):
    s = st.Store.create(tmp_path / "results.sqlite")
    s.write_experiment(id="t-1", name="t", seed=1, repeats=2, order_mode="interleaved", experiment_file="/e.yml",
                       inventory_file="/i.yml", config={"name": "t"}, matrix=["steps=1"], argv=["--matrix", "steps=1"],
                       hosts=["sim0"], specab_version="0", git_sha=None)
    s.write_arms([{"name": "baseline", "is_baseline": True, "baseline": "baseline",
                   "server_args": {"tp_size": 8}, "env": {}, "matrix": {}},
                  {"name": "eagle3-s1-k1-d2", "is_baseline": False, "baseline": "baseline",
                   "server_args": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1,
                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2},
                   "env": {}, "matrix": {"steps": 1}}])
    s.write_plan([r.to_json() for r in make_plan(["baseline", "eagle3-s1-k1-d2"], 2, seed=1)])
    return s


def test_roundtrip_and_missing(tmp_path):
    s = _store(tmp_path)
    assert [m["seq"] for m in s.missing()] == [1, 2, 3, 4]
    s.start_run(seq=1, run_id=s.plan()[0]["run_id"], arm=s.plan()[0]["arm"], block=1, host="sim0",
                run_dir="/r", runner_ident="x")
    recs = [{"i": 0, "warmup": True, "ok": True, "decode_tok_s": 80.0},
            {"i": 0, "warmup": False, "ok": True, "decode_tok_s": 82.0, "accept_len": None,
             "chunk_t_s": [0.1, 0.2], "chunk_tokens": [1, 1], "new_field": 5}]
    assert s.add_requests(1, "sim0", recs) == 2
    s.add_gpu_samples(1, "sim0", "timestamp,index,clocks.sm [MHz],memory.used [MiB],clocks_event_reasons.active\n"
                                 "1700000000.5,0,1980,100,0x0000000000000001\n")
    s.finish_run(1, status=st.OK, summary={"decode_tok_s_median": 82.0})
    assert [m["seq"] for m in s.missing()] == [2, 3, 4]
    run = s.runs()[0]
    assert run["status"] == "ok" and run["n_requests"] == 1 and run["decode_tok_s_median"] == 82.0
    req = s.requests()
    assert len(req) == 1 and req[0]["chunk_tokens"] == [1, 1] and req[0]["extra"] == {"new_field": 5}
    assert len(s.requests(include_warmup=True)) == 2
    g = s.gpu_samples(1)[0]
    assert g["sm_clock_mhz"] == 1980 and g["gpu"] == 0 and g["throttle_reasons"] == "0x0000000000000001"
    # nvidia-smi's own --format=csv (with units in every cell) reads the same; N/A is no number
    s.add_gpu_samples(1, "sim0", "timestamp,index,clocks.sm [MHz],memory.used [MiB],power.draw [W]\n"
                                 "1700000001.5,0,1965 MHz,812 MiB,[N/A]\n")
    g = s.gpu_samples(1)[1]
    assert (g["sm_clock_mhz"], g["mem_used_mib"], g["power_w"]) == (1965, 812, None)
    arms = s.arms()
    assert arms[1]["spec_steps"] == 1 and arms[1]["matrix"] == {"steps": 1}
    s.close()
    s2 = st.Store.open(tmp_path)            # a directory works too
    assert s2.experiment()["matrix"] == ["steps=1"]


def test_rerun_of_a_seq_replaces_the_unfinished_attempt(tmp_path):
    s = _store(tmp_path)
    s.start_run(seq=2, run_id="002-x", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="a")
    s.add_requests(2, "h", [{"i": 0, "ok": True, "warmup": False}])
    s.finish_run(2, status=st.INTERRUPTED)
    assert 2 in [m["seq"] for m in s.missing()]
    s.start_run(seq=2, run_id="002-x", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="b")
    assert s.requests(2) == [] and s.runs()[0]["attempt"] == 2


def test_a_teardown_recorded_after_the_row_is_added_to_it(tmp_path):
    """An interrupted per-run run's row is written before the driver's stop (nothing is lost if the stop fails);
    the stop's records fetched afterwards are added to it: the head's stop and GPUs-free records on the row, every
    rank's files and manifest under its host. A stop that recorded nothing leaves the row as it was."""
    from specab.driver.record import ingest_teardown
    s = _store(tmp_path)
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="a", run_dir="/r", runner_ident="x")
    s.finish_run(1, status=st.INTERRUPTED, failure_phase="benchmarking", stop={"total_s": 9.0})
    run_dir = tmp_path / "001-baseline"
    ingest_teardown(s, 1, run_dir, ["a"])             # the stop failed before it wrote anything
    assert s.runs()[0]["stop"] == {"total_s": 9.0} and s.runs()[0]["gpu_free"] is None and s.manifests() == []
    rank1 = run_dir / "node1-b"
    rank1.mkdir(parents=True)
    for d, stop_s, free_s in ((run_dir, 0.5, 0.25), (rank1, 0.75, 0.125)):
        (d / "stop.json").write_text(json.dumps({"total_s": stop_s}))
        (d / "gpu_free.json").write_text(json.dumps({"time_to_free_s": free_s}))
        (d / "gpu_free.csv").write_text("index,memory.used [MiB]\n0,0\n")
        (d / "manifest.json").write_text(json.dumps({"extra": {"stop_s": str(stop_s)}}))
    ingest_teardown(s, 1, run_dir, ["a"])
    run = s.runs()[0]
    assert (run["status"], run["stop"], run["gpu_free"]) == (st.INTERRUPTED, {"total_s": 0.5}, {"time_to_free_s": 0.25})
    assert {(m["host"], m["manifest"]["extra"]["stop_s"]) for m in s.manifests()} == {("a", "0.5"), ("b", "0.75")}
    files = {(r["host"], r["name"]): r["content"] for r in s.conn.execute("SELECT * FROM run_files WHERE seq=1")}
    assert sorted(files) == [(h, n) for h in "ab" for n in ("gpu_free.csv", "gpu_free.json", "stop.json")], files
    assert json.loads(files["b", "stop.json"]) == {"total_s": 0.75}


def test_open_refuses_other_files(tmp_path):
    with pytest.raises(st.StoreError, match="no results store"):
        st.Store.open(tmp_path / "nope")
    (tmp_path / "x.sqlite").write_text("not sqlite")
    with pytest.raises(st.StoreError):
        st.Store.open(tmp_path / "x.sqlite")


def test_a_version_1_store_with_timings_json_is_read_and_resumed(tmp_path):
    s = _store(tmp_path)
    s.conn.execute("ALTER TABLE runs ADD COLUMN timings_json TEXT")       # version 1 had it
    s.conn.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    s.conn.commit()
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="a")
    s.conn.execute("UPDATE runs SET timings_json='{\"old\": 1}' WHERE seq=1")
    s.conn.commit()
    s.close()
    s = st.Store.open(tmp_path)
    s.finish_run(1, status=st.OK, summary={"decode_tok_s_median": 82.0})
    run = s.runs()[0]
    assert run["status"] == "ok" and "timings" not in run and "timings_json" not in run
    assert "timings_json" not in {r[1] for r in st.Store.create(tmp_path / "new.sqlite").conn.execute(
        "PRAGMA table_info(runs)")}


def test_open_refuses_an_unknown_schema_version(tmp_path):
    s = _store(tmp_path)
    s.conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    s.conn.commit()
    s.close()
    with pytest.raises(st.StoreError, match="schema version 99, this specab reads 1, 2"):
        st.Store.open(tmp_path)


def test_finish_run_records_gpu_seconds_and_an_older_store_gains_the_columns(tmp_path):
    s = _store(tmp_path)
    # a store written before runs.gpus / runs.gpu_seconds existed
    s.conn.execute("ALTER TABLE runs DROP COLUMN gpu_seconds")
    s.conn.execute("ALTER TABLE runs DROP COLUMN gpus")
    s.conn.commit()
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="a")
    assert "gpu_seconds" not in s.runs()[0]                        # readable without the columns
    s.finish_run(1, status=st.OK, gpus=8)
    run = s.runs()[0]
    assert run["gpus"] == 8 and run["gpu_seconds"] == pytest.approx(8 * run["duration_s"])
    s.start_run(seq=2, run_id="002-x", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="b")
    s.finish_run(2, status=st.FAILED)                                # GPUs unknown: no cost invented
    assert s.runs()[1]["gpu_seconds"] is None
    s.close()


def test_gpu_seconds_span_the_runs_phases_when_it_has_them(tmp_path):
    s = _store(tmp_path)
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="h", run_dir="/r", runner_ident="a")
    s.record_phase(1, "loading", 100.0, 130.0)
    s.record_phase(1, "benchmarking", 130.0, 190.0)
    s.finish_run(1, status=st.OK, gpus=8)
    assert s.runs()[0]["gpu_seconds"] == pytest.approx(8 * 90.0)


def test_console_summary_says_single_stream_only_at_concurrency_1(tmp_path):
    import io
    from specab.driver import progress
    for conc, want, absent in ((1, "single-stream", "in flight"), (8, "8 requests in flight", "single-stream")):
        s = st.Store.create(tmp_path / f"c{conc}.sqlite")
        s.write_experiment(id="t-1", name="t", seed=1, repeats=1, order_mode="interleaved", experiment_file="/e.yml",
                           inventory_file="/i.yml", config={"name": "t", "bench": {"concurrency": conc}}, matrix=[],
                           argv=[], hosts=["sim0"], specab_version="0", git_sha=None)
        out = io.StringIO()
        progress.print_summary(s, out)
        title = next(line for line in out.getvalue().splitlines() if "per-arm summary" in line)
        assert want in title and absent not in title, title


def test_burn_in_runs_are_marked_in_the_plan_and_the_runs_and_an_older_store_gains_the_column(tmp_path):
    s = st.Store.create(tmp_path / "results.sqlite")
    s.conn.execute("ALTER TABLE plan DROP COLUMN burn_in")          # a store written before design.burn_in
    assert s.burn_in_seqs() == set()
    s.write_experiment(id="t-1", name="t", seed=1, repeats=1, order_mode="interleaved", experiment_file="/e.yml",
                       inventory_file="/i.yml", config={"name": "t"}, matrix=[], argv=[], hosts=["sim0"],
                       specab_version="0", git_sha=None)
    s.write_arms([{"name": "baseline", "is_baseline": True, "baseline": "baseline", "server_args": {}, "env": {}}])
    s.write_plan([r.to_json() for r in make_plan(["baseline"], 2, seed=1, burn_in=1)])
    assert [(r["run_id"], r["block"], r["burn_in"]) for r in s.plan()] == [
        ("001-baseline", 1, True), ("002-baseline", 1, False), ("003-baseline", 2, False)]
    assert s.burn_in_seqs() == {1}
    for seq in (1, 2):
        s.start_run(seq=seq, run_id=f"{seq:03d}-baseline", arm="baseline", block=1, host="sim0", run_dir="/r",
                    runner_ident="x")
        s.finish_run(seq, status=st.OK)
    assert [(r["seq"], r["burn_in"]) for r in s.runs()] == [(1, True), (2, False)]
    assert [m["seq"] for m in s.missing()] == [3]           # a finished burn-in is not run again by a resume
