"""A multi-node server's other ranks reach the store and the doctor: their env check, manifest and GPU
samples (collected into <run dir>/node<r>-<host>/) are stored under their host, the analysis keeps the
head's as the run's own and lists the others as ranks, and the doctor reads every rank."""
import json
from types import SimpleNamespace

from specab.analysis.evidence import model as analysis
from specab.analysis.findings import doctor
from specab.results import store as st
from specab.driver.record import ingest_run_dir, rank_dirs
from tests.analysis import factory as F


def _multinode_store(tmp_path, *, rank_env_missing=(), rank_reasons=0):
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 94.0}, blocks=2)
    d = F.write_store(exp, tmp_path)
    run = exp.runs[0]
    rank = d / run.run_id / "node1-gpu-b"
    rank.mkdir()
    (rank / "manifest.json").write_text(json.dumps({"run_id": run.run_id, "host": "gpu-b",
                                                    "extra": {"node_rank": "1", "nnodes": "2"}}))
    ec = F.env_check_json(SimpleNamespace(env_check=F.env_check(run.env, missing_in_workers=rank_env_missing)))
    (rank / "env_check.json").write_text(json.dumps(ec))
    w = run.window
    samples = F.gpu_samples(w[0], w[1], sm=1386 if rank_reasons else 1980, reasons=rank_reasons)
    (rank / "gpu_samples.csv").write_text(F.gpu_csv(SimpleNamespace(gpu_samples=samples)))
    (rank / "server.log").write_text("rank 1's log\n")
    with st.Store.open(d) as s:
        ingest_run_dir(s, run.seq, d / run.run_id, [run.host])
    return exp, d, run


def test_rank_dirs_are_found_by_rank_and_nothing_else(tmp_path):
    for name in ("node2-c", "node1-b.example", "node0-a", "nodes", "node1x-b", "bench"):
        (tmp_path / name).mkdir()
    (tmp_path / "node3-file").write_text("")
    assert [(h, p.name) for h, p in rank_dirs(tmp_path)] == [("b.example", "node1-b.example"), ("c", "node2-c")]


def test_the_ranks_files_are_stored_under_their_host_and_loaded_as_ranks(tmp_path):
    exp, d, run = _multinode_store(tmp_path)
    with st.Store.open(d) as s:
        assert {(m["seq"], m["host"]) for m in s.manifests() if m["seq"] == run.seq} == {(run.seq, run.host),
                                                                                        (run.seq, "gpu-b")}
        assert {c["host"] for c in s.env_checks() if c["seq"] == run.seq} == {run.host, "gpu-b"}
    back = analysis.load_store(d)
    r = next(x for x in back.runs if x.seq == run.seq)
    assert r.manifest["run_id"] == run.run_id and "extra" not in r.manifest        # the head's stays the run's
    assert r.env_check and r.env_check.variables and not r.env_check.unconfirmed()
    assert [(k.host, k.rank) for k in r.ranks] == [("gpu-b", 1)]
    assert r.ranks[0].env_check and r.ranks[0].env_check.variables and not r.ranks[0].env_check.unconfirmed()
    assert r.ranks[0].manifest["extra"]["nnodes"] == "2"
    assert {s.host for s in r.gpu_samples} == {run.host, "gpu-b"}
    assert all(not x.ranks for x in back.runs if x.seq != run.seq)
    assert not {f.rule for f in doctor.diagnose(back)} & {"env-not-confirmed", "gpu-throttled"}


def test_env_missing_on_rank_1_is_reported_with_its_rank_and_host(tmp_path):
    _, d, run = _multinode_store(tmp_path, rank_env_missing=("NCCL_ALGO",))
    f = [x for x in doctor.diagnose(analysis.load_store(d)) if x.rule == "env-not-confirmed"]
    assert len(f) == 1 and "NCCL_ALGO" in f[0].message and f[0].runs == [run.run_id]
    assert f[0].evidence[0].startswith(f"{run.run_id} (rank 1 on gpu-b): NCCL_ALGO expected"), f[0].evidence


def test_a_throttled_gpu_on_rank_1_is_reported_with_its_host(tmp_path):
    _, d, run = _multinode_store(tmp_path, rank_reasons=0x20)
    f = [x for x in doctor.diagnose(analysis.load_store(d)) if x.rule == "gpu-throttled"]
    assert len(f) == 1 and f[0].runs == [run.run_id], [x.rule for x in doctor.diagnose(analysis.load_store(d))]
    assert "SwThermalSlowdown (on gpu-b)" in f[0].evidence[0] and "GPU 0 on gpu-b" in f[0].evidence[0], f[0].evidence
    assert "GPU 0 on gpu-b 1386 MHz vs 1980 MHz" in f[0].evidence[1], f[0].evidence


def test_diff_of_a_multinode_run_from_the_store_reads_the_heads_manifest(tmp_path):
    from specab.analysis.render import provenance
    _, d, run = _multinode_store(tmp_path)
    label, manifest = provenance.load_manifest(f"{d}/{run.run_id}")
    assert label.endswith(run.run_id) and "extra" not in manifest and manifest["run_id"] == run.run_id
