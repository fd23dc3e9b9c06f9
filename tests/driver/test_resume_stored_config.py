"""`--resume` after the experiment file was deleted: the configuration the store holds stands in for it (written
beside the store and said), unless the store redacted a secret of it, which only the file can give back; and after
the runs directory moved to a fresh machine (scripts/known_truth_gpu.sh's SPECAB_KT_RESTORE on a lent GPU)."""
from __future__ import annotations

import re
import shutil
import signal
import tarfile
from pathlib import Path

import pytest
import yaml

from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port, reap_driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), time_scale="50")
    n.profile = "instant"
    yield n
    n.cleanup()


def run(*args: str) -> str:
    proc = driver(*args)
    out, _ = proc.communicate(timeout=500)
    return f"rc={proc.returncode}\n{out}"


def _interrupted_after_its_first_run(exp: Path, common: list[str]) -> str:
    """The driver's output of the experiment at two blocks on the per-run executor (one run at a time: the run queue
    would have run ahead on the node), interrupted with SIGINT once its first run is recorded."""
    proc = driver("-e", str(exp), "--repeats", "2", "--executor", "per-run", *common)
    head: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            head.append(line)
            if re.match(r"\s+ok in [\d.]+ s", line):
                proc.send_signal(signal.SIGINT)
                break
        out = "".join(head) + proc.communicate(timeout=300)[0]
    finally:
        reap_driver(proc, 60)
    assert proc.returncode == 130, out[-3000:]
    return out


def test_resume_without_the_experiment_file_uses_the_stored_configuration(node: SimNode) -> None:
    exp = node.write_experiment("gone", output_len=16)
    inv = node.write_inventory()
    common = ["-i", str(inv), "--runs-dir", str(node.runs_dir)]
    out = run("-e", str(exp), "--repeats", "1", *common)
    assert out.startswith("rc=0"), out[-3000:]
    exp_id = re.search(r"experiment directory: .*/(gone-\d{8}-\d{6})", out).group(1)
    # one number for one thing: the console's GPU-minutes after the last run are the report's verdict cost
    console = re.findall(r"; ([\d.]+) GPU-min spent", out)[-1]
    report = re.search(r"Verdict cost: ([\d.]+) GPU-minutes", (node.runs_dir / exp_id / "report.md").read_text())
    assert console == report.group(1), (console, report.group(0))
    exp.unlink()
    out = run("--resume", exp_id, *common)
    assert out.startswith("rc=0"), out[-3000:]
    copy = node.runs_dir / exp_id / "experiment.resumed.yml"
    assert f"the experiment file {exp} is gone: resuming with the configuration stored with the experiment ({copy})" \
        in out and f"resuming {exp_id}: 0 of " in out
    assert yaml.safe_load(copy.read_text())["specab_experiment"]["name"] == "gone"


def test_resume_refuses_a_stored_configuration_whose_secrets_were_redacted(node: SimNode) -> None:
    exp = node.write_experiment("secret", output_len=16)
    doc = yaml.safe_load(exp.read_text())
    doc["specab_experiment"]["env"]["HF_TOKEN"] = "hf_SECRETVALUE1234"
    exp.write_text(yaml.safe_dump(doc))
    inv = node.write_inventory()
    common = ["-i", str(inv), "--runs-dir", str(node.runs_dir)]
    out = run("plan", "-e", str(exp), *common)
    assert out.startswith("rc=0"), out[-2000:]
    out = run("-e", str(exp), "--repeats", "1", *common)
    assert out.startswith("rc=0"), out[-3000:]
    exp_id = re.search(r"experiment directory: .*/(secret-\d{8}-\d{6})", out).group(1)
    exp.unlink()
    out = run("--resume", exp_id, *common)
    assert out.startswith("rc=2") and "has its secret values redacted (env.HF_TOKEN): restore the file" in out, out
    assert "SECRETVALUE" not in out


def test_resume_counts_the_gpu_minutes_spent_before_it(node: SimNode) -> None:
    """The console's "X GPU-min spent" after a resume is the experiment's since its start: the runs the store held
    before the resume are counted (a run started again replaces its row, so what it spent before is not), and
    after the last run it equals the report's verdict cost. The experiment burns in (design.burn_in: 1): its first
    run, the one kept before the resume, is the burn-in, run by the per-run executor; the resume does not burn in
    again, and the verdict cost counts the burn-in's GPU-minutes."""
    exp = node.write_experiment("spent", output_len=16)
    exp.write_text(exp.read_text() + "  design:\n    burn_in: 1\n")
    common = ["-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir)]
    out = _interrupted_after_its_first_run(exp, common)
    exp_id = re.search(r"experiment directory: .*/(spent-\d{8}-\d{6})", out).group(1)
    with st.Store.open(node.runs_dir / exp_id) as s:
        kept = [r for r in s.runs() if r["status"] == "ok"]
        todo = len(s.plan()) - len(kept)
        burn_in = [(r["run_id"], r["status"], r["finished"]) for r in s.runs() if r["burn_in"]]
    assert len(kept) >= 1 and todo >= 1, (kept, todo)
    assert kept[0]["burn_in"] and [b[:2] for b in burn_in] == [(kept[0]["run_id"], "ok")], burn_in
    before = sum(r["gpu_seconds"] for r in kept) / 60
    assert before >= 0.2, f"a run's GPU-minutes ({before:.2f}) must show at the console's precision"
    out = run("--resume", exp_id, *common)
    assert out.startswith("rc=0"), out[-3000:]
    assert f"resuming {exp_id}: {todo} of " in out, out[-3000:]
    spent = [float(x) for x in re.findall(r"; ([\d.]+) GPU-min spent", out)]
    assert len(spent) == todo, out[-3000:]
    # printed to 0.1: what the store held and the first resumed run's own, rounded, is never below the former rounded
    assert spent[0] >= round(before, 1), f"the first run after the resume shows {spent[0]} GPU-min spent, the " \
                                         f"store held {before:.2f}"
    report = re.search(r"Verdict cost: ([\d.]+) GPU-minutes.*burn-in [\d.]+ \(1 unmeasured start\)",
                       (node.runs_dir / exp_id / "report.md").read_text())
    assert report and f"{spent[-1]:.1f}" == report.group(1), (spent, report and report.group(0))
    with st.Store.open(node.runs_dir / exp_id) as s:
        assert [(r["run_id"], r["status"], r["finished"]) for r in s.runs() if r["burn_in"]] == burn_in


def test_a_runs_directory_packed_and_unpacked_on_a_fresh_node_resumes_to_its_end(node: SimNode, tmp_path: Path) -> None:
    """A lent GPU machine is lost between two calls: the runs directory came back packed (runs.tgz), the node's own
    directory (its queue, its server state) is gone. Unpacked where it was, `--resume` runs what was left and the
    store ends with every planned run, the ones before the move kept as they were."""
    exp = node.write_experiment("moved", output_len=16)
    common = ["-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir)]
    # the resume on the fresh node is the run queue's, which has to set its node directory up again
    out = _interrupted_after_its_first_run(exp, common)
    exp_id = re.search(r"experiment directory: .*/(moved-\d{8}-\d{6})", out).group(1)
    with st.Store.open(node.runs_dir / exp_id) as s:
        before = {r["run_id"]: r["finished"] for r in s.runs() if r["status"] == "ok"}
        planned = len(s.plan())
    assert 1 <= len(before) < planned, (before, planned)
    packed = tmp_path / "runs.tgz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(node.runs_dir, arcname=".")
    shutil.rmtree(node.runs_dir)
    shutil.rmtree(node.node_dir)                # a fresh machine: nothing of the node's is left
    node.runs_dir.mkdir(parents=True)
    with tarfile.open(packed) as tar:
        tar.extractall(node.runs_dir)          # our own archive, as the script unpacks it
    out = run("--resume", exp_id, *common)
    assert out.startswith("rc=0"), out[-3000:]
    assert f"resuming {exp_id}: {planned - len(before)} of {planned}" in out, out[-3000:]
    with st.Store.open(node.runs_dir / exp_id) as s:
        runs = {r["run_id"]: r for r in s.runs()}
    assert len(runs) == planned and all(r["status"] == "ok" for r in runs.values())
    assert {k: runs[k]["finished"] for k in before} == before            # the runs before the move, untouched
    assert (node.runs_dir / exp_id / "report.md").is_file()
