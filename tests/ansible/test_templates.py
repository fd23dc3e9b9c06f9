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
