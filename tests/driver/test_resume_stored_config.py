"""`--resume` after the experiment file was deleted: the configuration the store holds stands in for it (written
beside the store and said), unless the store redacted a secret of it, which only the file can give back."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.driver.simnode import SimNode, driver, free_port

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
