"""The launch script and env file templates: every value reaches the engine literally.

The rendered script is executed for real, with a stand-in engine that reports its argv and
environment, so quoting is checked by bash itself rather than by reading the text.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from tests.ansible.template_render import render

PROBE = ("import json, os, sys; "
         "print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
         "('NCCL_PROTO', 'HOSTILE', 'NODE_VAR', 'SPT_NOENV')}}))")


def _deploy(tmp_path: Path, arm: dict, source_env_file: bool = True) -> Path:
    ctx = {"specab_arm": arm, "specab_engine_cmd": [sys.executable, "-c", PROBE],
           "specab_node_env": {"NODE_VAR": "a b$c"}, "specab_run_id": "001-" + arm["name"],
           "server_start_source_env_file": source_env_file}
    script = tmp_path / "launch.sh"
    script.write_text(render("launch_server.sh.j2", **ctx))
    script.chmod(0o755)
    (tmp_path / "nccl.env").write_text(render("nccl.env.j2", **ctx))
    return script


def test_values_with_shell_metacharacters_reach_the_engine_literally(tmp_path: Path) -> None:
    pwned = Path(f"/tmp/specab-pwned-{uuid.uuid4().hex[:8]}")
    hostile = f"x; touch {pwned}; $(touch {pwned}) `touch {pwned}` '\"\\"
    arm = {"name": "eagle3-s2",
           "server_args": {"model_path": f"/m/K; touch {pwned}", "tp_size": 8, "mem_fraction_static": 0.88,
                           "trust_remote_code": True, "enable_x": False, "skip_me": None,
                           "served_model_name": hostile, "cuda_graph_bs": [1, 2, "4 8"]},
           "env": {"NCCL_PROTO": "LL", "HOSTILE": hostile}}
    script = _deploy(tmp_path, arm)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # run it from another directory: the env file is found next to the script
    proc = subprocess.run([str(script)], cwd="/", capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert not pwned.exists(), "a templated value was executed"
    assert seen["argv"] == ["--model-path", f"/m/K; touch {pwned}", "--tp-size", "8", "--mem-fraction-static", "0.88",
                            "--trust-remote-code", "--served-model-name", hostile, "--cuda-graph-bs", "1", "2", "4 8"]
    assert seen["env"] == {"NCCL_PROTO": "LL", "HOSTILE": hostile, "NODE_VAR": "a b$c", "SPT_NOENV": "1"}


def test_the_test_only_knob_leaves_the_env_file_out(tmp_path: Path) -> None:
    script = _deploy(tmp_path, {"name": "baseline", "server_args": {"model_path": "/m"}, "env": {"NCCL_PROTO": "LL"}},
                     source_env_file=False)
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"]["NCCL_PROTO"] is None
    assert "TEST-ONLY" in script.read_text()


def test_a_newline_in_the_arm_name_cannot_escape_the_comment(tmp_path: Path) -> None:
    pwned = Path(f"/tmp/specab-pwned-{uuid.uuid4().hex[:8]}")
    script = _deploy(tmp_path, {"name": f"x\ntouch {pwned} #", "server_args": {"model_path": "/m"}, "env": {}})
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not pwned.exists()


VLLM_ARM = {"name": "draft-self-k3",
            "server_args": {"model_path": "/m/tiny llama", "load_format": "dummy", "enforce_eager": True,
                            "speculative_config": {"method": "draft_model", "model": "/m/it's <the> & draft",
                                                   "num_speculative_tokens": 3}},
            "env": {"NCCL_PROTO": "LL"}}


def _argv_of(script: Path) -> list:
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["argv"]


def _check_vllm_argv(argv: list) -> None:
    assert argv[:2] == ["--model", "/m/tiny llama"], argv
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == VLLM_ARM["server_args"]["speculative_config"]
    assert "--enforce-eager" in argv and "--model-path" not in argv


def test_vllm_arm_renders_model_and_speculative_config_json(tmp_path: Path) -> None:
    """engine vllm: model_path is --model, a mapping is one JSON word (the driver's render)."""
    ctx = {"specab_arm": VLLM_ARM, "specab_engine_cmd": [sys.executable, "-c", PROBE], "specab_node_env": {},
           "specab_engine": "vllm"}
    script = tmp_path / "launch.sh"
    script.write_text(render("launch_server.sh.j2", **ctx))
    (tmp_path / "nccl.env").write_text(render("nccl.env.j2", **ctx))
    _check_vllm_argv(_argv_of(script))
    ctx["specab_engine"] = "sglang"
    script.write_text(render("launch_server.sh.j2", **ctx))
    assert _argv_of(script)[:2] == ["--model-path", "/m/tiny llama"]


def test_vllm_arm_through_ansibles_own_template_module(tmp_path: Path) -> None:
    """The same bytes through Ansible's template module, whose `quote` once turned the JSON's quotes into &#39;
    (a Markup string from `tojson`): the first real vLLM round failed on it."""
    repo = Path(__file__).resolve().parents[2]
    venv_bin = Path(sys.executable).parent
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"specab_arm": VLLM_ARM, "specab_engine_cmd": [sys.executable, "-c", PROBE],
                                 "specab_node_env": {}, "specab_engine": "vllm"}))
    for name, dest in (("launch_server.sh.j2", "launch.sh"), ("nccl.env.j2", "nccl.env")):
        out = subprocess.run([str(venv_bin / "ansible"), "localhost", "-c", "local", "-m", "ansible.builtin.template",
                              "-a", f"src={repo}/templates/{name} dest={tmp_path / dest} mode=0755",
                              "-e", f"@{extra}"], capture_output=True, text=True, timeout=120, cwd=repo)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "&#39;" not in (tmp_path / "launch.sh").read_text()
    _check_vllm_argv(_argv_of(tmp_path / "launch.sh"))
