"""Faults during an experiment, end to end through the driver on the simulated node.

One experiment (one interleaved block, seeded so that the crash comes first) is shared by this module:
  001-eagle3-crash  the server dies mid-benchmark (SPECAB_SIM_FAULT=crash_after=4: 1 warm-up + 3 measured)
  002-baseline      must start from a verified clean node and succeed
A secret is planted in the experiment's env and in the driver's own environment.
"""
from __future__ import annotations

import json

import pytest

from specab.results import store as st
from specab.config.plan import make_plan
from tests.driver.simnode import NCCL_TUNED, SimNode, driver, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SECRET = "hf_plantedsecret123"                 # in the experiment env and in the driver's environment
DRIVER_ONLY_SECRET = "pw-planted-driver-only-4711"
CRASH_ARMS = """\
arms:
  - name: baseline
  - name: eagle3-crash
    server_args:
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 2
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 3
    env:
      SPECAB_SIM_FAULT: crash_after=4
"""
NUM_REQUESTS = 8


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("runfaults")
    node = SimNode(root=root, port=free_port(), profile="instant", time_scale="5")
    exp = node.write_experiment("crash", arms=CRASH_ARMS, num_requests=NUM_REQUESTS, output_len=32)
    data = json.loads(json.dumps(__import__("yaml").safe_load(exp.read_text())))
    data["specab_experiment"]["env"] = dict(NCCL_TUNED, HF_TOKEN=SECRET)
    exp.write_text(json.dumps(data))
    inv = node.write_inventory()
    env = {"HF_TOKEN": SECRET, "MY_SERVICE_PASSWORD": DRIVER_ONLY_SECRET, "XDG_CACHE_HOME": str(root / "cache")}
    seed = next(n for n in range(1, 100) if make_plan(["baseline", "eagle3-crash"], 1, n)[0].arm == "eagle3-crash")
    proc = driver("--seed", str(seed), "--repeats", "1", "-e", str(exp), "-i", str(inv),
                  "--runs-dir", str(node.runs_dir), env=env)
    try:
        out, _ = proc.communicate(timeout=500)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        node_alive = node.server_alive()
        node.cleanup()
    exp_dirs = [d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists()]
    assert len(exp_dirs) == 1, out[-3000:]
    with st.Store.open(exp_dirs[0]) as s:
        runs = {r["run_id"]: r for r in s.runs()}
        reqs = {rid: s.requests(r["seq"], include_warmup=True) for rid, r in runs.items()}
        phases = {rid: [p["phase"] for p in s.phases(r["seq"])] for rid, r in runs.items()}
    return {"node": node, "out": out, "rc": proc.returncode, "exp_dir": exp_dirs[0], "runs": runs,
            "requests": reqs, "phases": phases, "server_alive_after": node_alive}


def test_item02_server_crash_mid_benchmark_keeps_partial_records_and_fails_the_run(experiment):
    runs, out = experiment["runs"], experiment["out"]
    assert experiment["rc"] == 1, out[-3000:]                 # a failed run, the experiment finished
    crash = runs["001-eagle3-crash"]
    assert crash["status"] == "failed" and crash["partial"], crash
    assert crash["failure_phase"] in ("benchmarking", "warming up"), crash["failure_phase"]
    # the log tail shows why: the simulated scheduler's CUDA error
    assert crash["log_tail"] and "illegal memory access" in crash["log_tail"]
    # the requests that finished before the crash are kept (1 warm-up + 3 measured answered)
    done = [q for q in experiment["requests"]["001-eagle3-crash"] if q["ok"]]
    assert len(done) == 4 and sum(1 for q in done if not q["warmup"]) == 3
    # each with the decode rate the client measured: every request it could time (one whose stream did not reach
    # it in bursts, which a loaded box can cause: no pace to read there)
    bench = [json.loads(x) for x in (experiment["exp_dir"] / "001-eagle3-crash" / "bench.jsonl").read_text().splitlines()]
    timed = [b for b in bench if b["ok"] and not b.get("buffered")]
    assert all(b["decode_tok_s"] > 0 for b in timed)
    assert sorted(q["decode_tok_s"] for q in done if q["decode_tok_s"]) == sorted(b["decode_tok_s"] for b in timed)
    assert "FAILED 001-eagle3-crash" in out


def test_item02_next_run_starts_on_a_verified_clean_node(experiment):
    runs = experiment["runs"]
    nxt = runs["002-baseline"]
    assert nxt["status"] == "ok" and nxt["n_requests"] == NUM_REQUESTS, nxt
    # its first steps stopped whatever the crash left and waited until every GPU was free, then it started
    phases = experiment["phases"]["002-baseline"]
    assert phases.index("stopping") < phases.index("waiting for GPUs") < phases.index("starting"), phases
    gpu_free = nxt["gpu_free"]
    assert gpu_free and not gpu_free.get("error"), gpu_free
    assert not experiment["server_alive_after"] and experiment["node"].gpus_busy() == []


def test_item18_planted_secret_is_in_no_file_of_the_experiment(experiment):
    """Every file of the experiment directory (store, manifests, runner artifacts) and of the node directory
    is grepped: the secret of the driver's environment is nowhere; the experiment env's HF_TOKEN only in the
    arm's env files, which are 0600."""
    node: SimNode = experiment["node"]
    found_in_env_files = []
    roots = (experiment["exp_dir"], node.node_dir)
    checked = 0
    for root in roots:
        for f in root.rglob("*"):
            if not f.is_file():
                continue
            checked += 1
            data = f.read_bytes()
            assert DRIVER_ONLY_SECRET.encode() not in data, f"driver environment secret in {f}"
            if SECRET.encode() in data:
                assert f.name == "nccl.env", f"{SECRET} leaked into {f}"
                assert f.stat().st_mode & 0o077 == 0, f"{f} holds a secret with mode {oct(f.stat().st_mode)}"
                found_in_env_files.append(f)
    artifacts = list((experiment["exp_dir"] / ".runner").rglob("command"))
    assert artifacts, "no ansible-runner artifacts were grepped"
    assert checked > 30
    assert found_in_env_files, "the planted HF_TOKEN never reached the env file (the test would prove nothing)"
    # the stored experiment config and the manifests show it redacted
    manifest = json.loads((experiment["exp_dir"] / "002-baseline" / "manifest.json").read_text())
    assert "<redacted>" in json.dumps(manifest) or "HF_TOKEN" not in json.dumps(manifest)
