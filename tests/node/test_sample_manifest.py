"""gpusample (CSV until SIGTERM, old-driver field name) and manifest (provenance, redaction)."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import time

from tests.node.helpers import HERE, NODE_DIR_SRC, PY, run_tool, wait_for

SAMPLE_HEADER = ["timestamp", "index", "uuid", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "temperature.gpu",
                 "utilization.gpu", "clocks_event_reasons.active", "memory.used"]


def test_gpusample_writes_rows_until_sigterm(tmp_path, sim):
    out = tmp_path / "gpu_samples.csv"
    p = subprocess.Popen([PY, str(NODE_DIR_SRC), "gpusample", "--smi", sim.smi_json, "--interval", "0.1",
                          "--gpus", "0,1", "--out", str(out)], env=sim.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        # rows are flushed as written: readable while the sampler still runs
        assert wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 7, 30)
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["stopped_by"] == "SIGTERM" and summary["errors"] == 0 and summary["gpus"] == [0, 1]
    rows = list(csv.reader(out.open()))
    assert rows[0] == SAMPLE_HEADER
    assert len(rows) - 1 == summary["rows"] == 2 * summary["samples"]
    first = dict(zip(rows[0], rows[1]))
    assert abs(float(first["timestamp"]) - time.time()) < 120
    assert first["index"] == "0" and first["clocks_event_reasons.active"].startswith("0x")
    assert first["uuid"].startswith("GPU-")
    assert int(first["clocks.max.sm"]) > 0 and float(first["power.draw"]) > 0
    assert {r[1] for r in rows[1:]} == {"0", "1"}


def test_gpusample_falls_back_to_the_old_reasons_field(tmp_path):
    smi = json.dumps([PY, str(HERE / "fake_smi.py"), "--mode", "old"])
    out = tmp_path / "s.csv"
    r = run_tool("gpusample", "--smi", smi, "--interval", "0.05", "--count", "2", "--out", out)
    assert r.rc == 0, r.error
    rows = list(csv.reader(out.open()))
    assert rows[0] == SAMPLE_HEADER and len(rows) == 3
    assert rows[1][1:] == ["0", "GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35", "375", "3201", "1980", "117.18", "37", "0", "0x0000000000000001", "0"]


def test_gpusample_fails_when_no_sample_succeeds(tmp_path):
    smi = json.dumps([PY, str(HERE / "fake_smi.py"), "--mode", "hang"])
    r = run_tool("gpusample", "--smi", smi, "--interval", "0.05", "--count", "1", "--smi-timeout", "0.5",
                 "--out", tmp_path / "s.csv")
    assert r.rc == 1 and "nvidia-smi did not answer within 0.5 s" in r.error


def test_manifest_records_provenance_and_redacts_secrets(tmp_path, server, sim):
    model = tmp_path / "models" / "target"
    draft = tmp_path / "models" / "draft"
    for d, arch in ((model, "DeepseekV3ForCausalLM"), (draft, "LlamaForCausalLMEagle3")):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"architectures": [arch], "max_position_embeddings": 4096}))
        (d / "generation_config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"\0" * 100)
    server.write_launch(env_lines="NCCL_PROTO=LL\nHF_TOKEN=hf_planted_secret_123\n",
                        args={"model_path": str(model), "speculative_draft_model_path": str(draft),
                              "api_key": "sk-planted-456"})
    assert server.start().rc == 0 and server.ready().rc == 0
    out = server.run_dir / "node_manifest.json"
    r = run_tool("manifest", "--run-dir", server.run_dir, "--node-dir", server.node_dir, "--smi", sim.smi_json,
                 "--python", PY, "--seed", "1", "--extra", "OPENAI_API_KEY=sk-extra-789", "--extra", "dataset=abc",
                 "--out", out, env=sim.env)
    assert r.rc == 0, r.error
    m = json.loads(out.read_text())
    assert m["run_id"] == "001-baseline" and m["seed"] == "1"
    assert m["host"]["hostname"] and m["host"]["kernel"]
    assert m["versions"]["sglang"] == "absent"  # not installed here; recorded, not fatal
    assert "torch" in m["versions"]
    assert m["gpu"]["driver_version"] == "580.159.04"
    assert len(m["gpu"]["gpus"]) == 8 and m["gpu"]["gpus"][0]["uuid"].startswith("GPU-")
    assert m["gpu"]["gpus"][0]["clocks.max.sm"] > 0
    cfg_sha = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    assert m["models"]["target"]["config_sha256"] == cfg_sha
    assert set(m["models"]["draft"]["json_sha256"]) == {"config.json", "generation_config.json"}
    assert m["models"]["draft"]["architectures"] == ["LlamaForCausalLMEagle3"]
    assert m["launch"]["sha256"] == hashlib.sha256((server.run_dir / "launch.sh").read_bytes()).hexdigest()
    assert m["server"]["environ"]["NCCL_PROTO"] == "LL"
    assert m["env_file"]["values"] == {"NCCL_PROTO": "LL", "HF_TOKEN": "<redacted>"}
    assert m["server_args"]["api_key"] == "<redacted>" and m["extra"] == {"OPENAI_API_KEY": "<redacted>",
                                                                          "dataset": "abc"}
    text = out.read_text() + json.dumps(r.data)
    for secret in ("hf_planted_secret_123", "sk-planted-456", "sk-extra-789"):
        assert secret not in text


def test_manifest_survives_missing_pieces(tmp_path):
    smi = json.dumps([PY, str(HERE / "fake_smi.py"), "--mode", "hang"])
    r = run_tool("manifest", "--run-dir", tmp_path / "run", "--node-dir", tmp_path / "node", "--smi", smi,
                 "--smi-timeout", "0.5", "--python", "/nonexistent/python3", "--model-path", "/nonexistent/model")
    assert r.rc == 0, r.error
    assert "did not answer within 0.5 s" in r.data["gpu"]["error"]
    assert r.data["versions"]["sglang"].startswith("error:")
    assert r.data["models"]["target"] == {"path": "/nonexistent/model", "exists": False}
    assert r.data["server"] is None and r.data["launch"] is None


def test_gpusample_stops_when_its_parent_exits(tmp_path, sim):
    """The bench role's shell backgrounds a function: killing the subshell orphans the sampler, which would run
    nvidia-smi forever. The sampler notices its parent's exit and stops."""
    out = tmp_path / "s.csv"
    pidfile = tmp_path / "pid"
    script = ('sampler() { %s %s gpusample --smi %s --interval 0.1 --out %s "$@"; }\n'
              'sampler > %s 2>/dev/null &\necho $! > %s\nwait\n') % (
        PY, NODE_DIR_SRC, "'" + sim.smi_json + "'", out, tmp_path / "json", pidfile)
    shell = subprocess.Popen(["bash", "-c", script], env=sim.env)
    try:
        assert wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 3, 60)
        subshell = int(pidfile.read_text())
        sampler = int(subprocess.run(["pgrep", "-P", str(subshell)], capture_output=True, text=True).stdout.split()[0])
        os.kill(subshell, signal.SIGTERM)  # what the role's `kill "$sampler_pid"` did
        assert wait_for(lambda: not os.path.exists("/proc/%d" % sampler) or
                        open("/proc/%d/stat" % sampler).read().split(") ")[1][0] == "Z", 30)
        assert json.loads((tmp_path / "json").read_text())["stopped_by"] == "parent exited"
    finally:
        shell.kill()
        shell.wait()
