"""`diff` lists exactly what differs between two runs' manifests, never a secret."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specab.analysis.render import provenance

ROOT = Path(__file__).resolve().parents[2]
SMI = json.dumps([sys.executable, "-m", "specab.sim.smi"])


def make_run(tmp: Path, name: str, args: dict, env: dict, engine: dict | None = None,
             server_info: dict | None = None) -> Path:
    """A run directory with a manifest written by the real node tool (specab/node/manifest.py)."""
    rd = tmp / name
    rd.mkdir(parents=True)
    if engine is not None:       # as roles/server_start writes it beside launch.sh
        (rd / "engine.json").write_text(json.dumps(engine))
    if server_info is not None:  # as envcheck writes the server's /server_info body
        (rd / "server_info.json").write_text(json.dumps(server_info))
    (rd / "args.json").write_text(json.dumps(args))
    (rd / "nccl.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in args.items())
    (rd / "launch.sh").write_text(f"set -a; . {rd}/nccl.env; exec python3 -m sglang.launch_server {flags}\n")
    r = subprocess.run([sys.executable, str(ROOT / "specab/node"), "manifest", "--run-dir", str(rd),
                        "--node-dir", str(tmp / "node"), "--smi", SMI, "--seed", "1", "--probe-timeout", "20",
                        "--out", str(rd / "manifest.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                            "SPECAB_SIM_STATE": str(tmp / "simstate")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (rd / "manifest.json").is_file(), r.stdout
    return rd


ARGS = {"tp_size": 8, "mem_fraction_static": 0.88, "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "HF_TOKEN": "hf_s3cr3t_value"}


def test_diff_of_two_runs_lists_exactly_the_nccl_variable_and_the_arg(tmp_path):
    (tmp_path / "node").mkdir()
    a = make_run(tmp_path, "003-eagle3-s2", ARGS, ENV)
    b = make_run(tmp_path, "007-eagle3-s2", {**ARGS, "mem_fraction_static": 0.85}, {**ENV, "NCCL_PROTO": "Simple"})
    r = subprocess.run([sys.executable, "-m", "specab.analysis.render.provenance", "diff", str(a), str(b), "--format", "json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    got = {(d["category"], d["key"], json.dumps(d["a"]), json.dumps(d["b"])) for d in out["differences"]}
    assert got == {("engine args", "mem_fraction_static", "0.88", "0.85"),
                   ("env", "NCCL_PROTO", '"LL"', '"Simple"')}
    assert "hf_s3cr3t_value" not in r.stdout
    text = subprocess.run([sys.executable, "-m", "specab.analysis.render.provenance", "diff", str(a), str(b)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert "NCCL_PROTO: LL -> Simple" in text and "mem_fraction_static: 0.88 -> 0.85" in text
    # --all also shows what changes on every run (paths, timestamps, the rendered launch script)
    every = provenance.diff_manifests(json.loads((a / "manifest.json").read_text()),
                                      json.loads((b / "manifest.json").read_text()), include_volatile=True)
    assert any(d.category == "volatile" and d.key.startswith("launch.") for d in every)


def test_env_factor_is_one_difference_even_when_seen_in_two_places_and_secrets_stay_hidden():
    a = {"server_args": {"speculative_num_steps": 2}, "env_file": {"values": {"NCCL_PROTO": "LL", "API_KEY": "k1"}},
         "server": {"environ": {"NCCL_PROTO": "LL"}, "record": {"pid": 10}}, "created_at": 1.0,
         "gpu": {"gpus": [{"index": 0, "uuid": "GPU-a", "clocks.sm": 345, "clocks.max.sm": 1980}]},
         "models": {"draft": {"config_sha256": "aaa"}}, "seed": 1}
    b = {"server_args": {"speculative_num_steps": 2}, "env_file": {"values": {"NCCL_PROTO": "Simple", "API_KEY": "k2"}},
         "server": {"environ": {"NCCL_PROTO": "Simple"}, "record": {"pid": 99}}, "created_at": 2.0,
         "gpu": {"gpus": [{"index": 0, "uuid": "GPU-b", "clocks.sm": 1980, "clocks.max.sm": 1980}]},
         "models": {"draft": {"config_sha256": "bbb"}}, "seed": 2}
    d = provenance.diff_manifests(a, b)
    keys = [(x.category, x.key) for x in d]
    assert keys == [("env", "API_KEY"), ("env", "NCCL_PROTO"), ("gpu", "gpus[0].uuid"),
                    ("models", "draft.config_sha256"), ("seed", "seed")]
    nccl = d[1]
    assert nccl.sources == ("env_file.values.NCCL_PROTO", "server.environ.NCCL_PROTO")
    assert "k1" not in json.dumps([x.to_dict() for x in d]) and "k2" not in json.dumps([x.to_dict() for x in d])


def test_unknown_run_is_an_actionable_error(tmp_path):
    with pytest.raises(provenance.ProvenanceError, match="experiment>/<run-id>"):
        provenance.load_manifest("nope", tmp_path)


def test_diff_of_two_engine_builds_shows_the_version_change(tmp_path):
    """Each manifest records its engine build, the version its server reported and the --help
    fingerprint; `diff` names exactly that change, first."""
    (tmp_path / "node").mkdir()
    cmd = ["python3", "-m", "sglang.launch_server"]
    a = make_run(tmp_path, "001-baseline-sglang-0.5.9", ARGS, ENV,
                 {"build": "sglang-0.5.9", "cmd": cmd, "flags_fingerprint": "aaaa"}, {**ARGS, "version": "0.5.9"})
    b = make_run(tmp_path, "002-baseline-sglang-0.5.23", ARGS, ENV,
                 {"build": "sglang-0.5.23", "cmd": cmd, "flags_fingerprint": "bbbb"}, {**ARGS, "version": "0.5.23"})
    mb = json.loads((b / "manifest.json").read_text())
    assert mb["engine"] == {"build": "sglang-0.5.23", "cmd": cmd, "flags_fingerprint": "bbbb", "version": "0.5.23",
                            "version_source": "server_info", "generation": "0.5.23"}
    diffs = provenance.diff_manifests(json.loads((a / "manifest.json").read_text()), mb)
    got = {(d.category, d.key, d.a, d.b) for d in diffs}
    assert got == {("engine", "build", "sglang-0.5.9", "sglang-0.5.23"), ("engine", "version", "0.5.9", "0.5.23"),
                   ("engine", "generation", "0.5.9", "0.5.23"), ("engine", "flags_fingerprint", "aaaa", "bbbb")}
    assert diffs[0].category == "engine"
