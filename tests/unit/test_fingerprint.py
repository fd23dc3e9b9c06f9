"""The experiment fingerprint (specab/config/fingerprint.py) and its store records."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from specab.config.fingerprint import changes, fingerprint
from specab.results import store as st


DOC = {"model_path": "/m", "server_args": {"tp_size": 8}, "env": {"NCCL_PROTO": "LL"},
       "arms": {"baseline": {"server_args": {"tp_size": 8}, "env": {}}},
       "bench": {"num_requests": 2, "output_len": 32}, "timeouts": {"ready_s": 1800}}


def test_fingerprint_changes_with_bench_and_timeouts_and_names_them():
    other = {**DOC, "bench": {"num_requests": 6, "output_len": 32}, "timeouts": {"ready_s": 600}}
    assert fingerprint(DOC) == fingerprint(dict(reversed(list(DOC.items()))))     # key order does not count
    assert fingerprint(DOC) != fingerprint(other)
    assert changes(DOC, other) == ["bench.num_requests: 2 -> 6", "timeouts.ready_s: 1800 -> 600"]
    assert 'env.NCCL_PROTO: "LL" -> (absent)' in changes(DOC, {**DOC, "env": {}})


def _store(tmp_path: Path) -> st.Store:
    s = st.Store.create(tmp_path / st.FILENAME)
    s.write_experiment(id="x-1", name="x", seed=1, repeats=1, order_mode="interleaved", experiment_file="e.yml",
                       inventory_file="i.yml", config={}, matrix=[], argv=[], hosts=["h"], specab_version=None,
                       git_sha=None)
    s.write_arms([{"name": "baseline", "server_args": {}, "env": {}, "is_baseline": True, "baseline": "baseline",
                   "matrix": {}}])
    s.write_plan([{"seq": i, "block": i, "arm": "baseline", "position": 1, "run_id": f"00{i}-baseline"}
                  for i in (1, 2)], repeats=2)
    return s


def test_store_marks_each_run_with_its_sessions_fingerprint(tmp_path: Path):
    s = _store(tmp_path)
    s.set_session_fingerprint("a" * 16, DOC)
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="h", run_dir="/r1", runner_ident="i")
    s.set_session_fingerprint("b" * 16, {**DOC, "bench": {}}, forced=True)
    s.start_run(seq=2, run_id="002-baseline", arm="baseline", block=2, host="h", run_dir="/r2", runner_ident="i")
    assert s.fingerprint() == ("a" * 16, DOC)              # the experiment's own: the first one
    assert s.run_fingerprints() == {1: "a" * 16, 2: "b" * 16}
    s.close()


def test_a_store_written_before_fingerprints_stays_readable_and_resumable(tmp_path: Path):
    s = _store(tmp_path)
    s.close()
    with sqlite3.connect(tmp_path / st.FILENAME) as c:       # as an older specab wrote it
        c.execute("DROP TABLE fingerprints")
        c.execute("DROP TABLE run_fingerprints")
    s = st.Store.open(tmp_path)
    assert s.fingerprint() is None and s.run_fingerprints() == {}
    s.start_run(seq=1, run_id="001-baseline", arm="baseline", block=1, host="h", run_dir="/r1", runner_ident="i")
    s.set_session_fingerprint("c" * 16, DOC)
    s.start_run(seq=2, run_id="002-baseline", arm="baseline", block=2, host="h", run_dir="/r2", runner_ident="i")
    assert s.run_fingerprints() == {2: "c" * 16}
    s.close()


def test_a_key_added_later_at_its_earlier_value_is_no_change_and_another_value_is():
    """Stores written before `bench.ignore_eos` existed ran past EOS: such a document and a current one with
    ignore_eos true are the same experiment (the resume goes on, the history matches); false is a change, named."""
    now = {**DOC, "bench": {**DOC["bench"], "ignore_eos": True}}
    assert fingerprint(now) == fingerprint(DOC) and changes(DOC, now) == []
    natural = {**DOC, "bench": {**DOC["bench"], "ignore_eos": False}}
    assert fingerprint(natural) != fingerprint(DOC)
    assert changes(DOC, natural) == ["bench.ignore_eos: (absent) -> false"]
