"""A dataset experiment through the driver on the simulated node (the run queue): the controller's file reaches the
node (node_prepare's copy), the client draws from it on the chat API with ignore_eos false, and every run's
requests carry their categories while its manifest names the file and its sha256. The report written at the end
labels the workload and gives the speculative arm's per-category table, checked exactly against the requests in the
store (the simulator's acceptance does not depend on the category, so the numbers are the store's, not a truth)."""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from specab.analysis.evidence.model import load_store
from specab.results import store as st
from tests.driver.simnode import SimNode, driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_chat_dataset_runs_through_the_queue(node: SimNode) -> None:
    node.profile = "instant"
    exp_file = node.write_experiment("ds", output_len=24)
    doc = yaml.safe_load(exp_file.read_text())
    data = exp_file.parent / "prompts.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "def add(a, b):"}], "category": "code"}\n'
                    '{"prompt": "Tell me about the sea.", "category": "chat"}\n')
    doc["specab_experiment"]["bench"].update(api="chat", dataset="prompts.jsonl", ignore_eos=False)
    exp_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = node.write_inventory()
    proc = driver("-e", str(exp_file), "-i", str(inv), "--runs-dir", str(node.runs_dir), "--repeats", "1")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
    sha = "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    assert (node.node_dir / "datasets" / "prompts.jsonl").read_bytes() == data.read_bytes()
    runs = sorted(p for p in exp_dir.iterdir() if p.is_dir() and (p / "bench.jsonl").exists())
    assert len(runs) == 2
    for run in runs:
        recs = [json.loads(x) for x in (run / "bench.jsonl").read_text().splitlines()]
        assert {r["category"] for r in recs} == {"code", "chat"} and all(r["ok"] for r in recs)
        assert any(r["finish_reason"] == "stop" for r in recs)
        m = json.loads((run / "manifest.json").read_text())
        assert m["dataset"]["sha256"] == sha and m["dataset"]["kind"] == "file" and m["dataset"]["ignore_eos"] is False
    _report_matches_the_store(exp_dir, sha, per_request_accept=False, ignore_eos=False)
    # natural ends: the doctor has nothing to say about forced continuations
    rep = json.loads((exp_dir / "report.json").read_text())
    assert "forced-continuation" not in {f["rule"] for f in rep["findings"]}, rep["findings"]


def test_per_category_accept_and_speedup_on_the_generate_api(node: SimNode) -> None:
    """Prompt records on SGLang's native API, whose answers carry each request's cycle count: the per-category
    accept lengths are the requests' own, and the per-position acceptance the report gives is the sum of the
    requests' own counts (their histograms). Run with ignore_eos true, every answer of these real prompts ran to
    output_len: the doctor names the forced continuations."""
    node.profile = "instant"
    exp_file = node.write_experiment("dsgen", output_len=24, num_requests=6)
    doc = yaml.safe_load(exp_file.read_text())
    data = exp_file.parent / "prompts.jsonl"
    data.write_text('{"prompt": "def add(a, b):", "category": "code"}\n'
                    '{"prompt": "Tell me about the sea.", "category": "chat"}\n')
    doc["specab_experiment"]["bench"].update(dataset="prompts.jsonl", ignore_eos=True)
    exp_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = driver("-e", str(exp_file), "-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir),
                  "--repeats", "1")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
    sha = "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    _report_matches_the_store(exp_dir, sha, per_request_accept=True, ignore_eos=True)
    rep = json.loads((exp_dir / "report.json").read_text())
    exp = load_store(exp_dir)
    spec, = exp.spec_arms
    run, = exp.runs_of(spec.name)
    recs = [json.loads(x) for x in (run.run_dir / "bench.jsonl").read_text().splitlines()]
    measured = [r for r in recs if not r["warmup"]]
    assert all(r["finish_reason"] == "length" for r in measured)
    (forced,) = [f for f in rep["findings"] if f["rule"] == "forced-continuation"]
    assert forced["severity"] == "warning" and forced["arm"] == spec.name
    assert f"{len(measured)} of {len(measured)} measured requests on real prompts ran to output_len" in forced["message"]
    # per position: the sum of the measured requests' own counts, from the simulated engine's histograms
    pos = rep["positions"][spec.name]["pooled"]
    assert pos["cycles"] == sum(r["spec_verify_ct"] for r in measured)
    assert pos["accepted"] == [sum(r["spec_accepted_per_pos"][i] if i < len(r["spec_accepted_per_pos"]) else 0
                                   for r in measured) for i in range(spec.steps)]
    assert "## Acceptance per draft position" in (exp_dir / "report.md").read_text()


def _report_matches_the_store(exp_dir: Path, sha: str, per_request_accept: bool, ignore_eos: bool) -> None:
    """report.json's workload against the store's own requests: label, lengths and the per-category rows (one block:
    the speedup is that block's ratio of category medians, and there is no interval)."""
    rep = json.loads((exp_dir / "report.json").read_text())
    wl = rep["workload"]
    assert wl["ignore_eos"] is ignore_eos and sha in wl["label"] and "2 records" in wl["label"]
    assert rep["summary"][0] == f"Workload: {wl['label']}."
    exp = load_store(exp_dir)
    spec = [a.name for a in exp.spec_arms]
    assert len(spec) == 1 and set(wl["categories"]) == set(spec)
    base_run, = exp.runs_of(exp.baseline)
    run, = exp.runs_of(spec[0])
    for row in wl["categories"][spec[0]]:
        mine = [q for q in run.measured if q.category == row["category"]]
        theirs = [q for q in base_run.measured if q.category == row["category"]]
        acc = [q.accept_len for q in mine if q.accept_len is not None]
        assert mine and theirs and (acc or not per_request_accept)
        assert row["requests"] == len(mine)
        if acc:
            assert row["accept_len_median"] == statistics.median(acc)
            assert math.isclose(row["accept_len_mean"], statistics.fmean(acc), rel_tol=1e-12)
        else:       # the chat API's answers carry no cycle count: the table says so rather than guess
            assert row["accept_len_median"] is None and row["accept_len_mean"] is None
        tok, base_tok = (statistics.median(q.decode_tok_s for q in x) for x in (mine, theirs))
        assert (row["tok_s_median"], row["baseline_tok_s_median"]) == (tok, base_tok)
        assert row["ratios"] == [tok / base_tok] and row["speedup"] == tok / base_tok and row["ci"] is None
    assert {r["category"] for r in wl["categories"][spec[0]]} == {"code", "chat"}
    for arm, got in wl["lengths"].items():
        out = [q.output_tokens for r in exp.runs_of(arm) for q in r.measured]
        stops = sum(1 for r in exp.runs_of(arm) for q in r.measured if q.finish_reason == "stop")
        assert (got["requests"], got["median"], got["stopped"]) == (len(out), statistics.median(out), stops)
    md = (exp_dir / "report.md").read_text()
    assert f"### Per category: {spec[0]} vs {exp.baseline}" in md and "(interval: none, 1 block)" in md
