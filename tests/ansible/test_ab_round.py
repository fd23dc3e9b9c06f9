"""ab_test.yml: one A/B round (baseline vs EAGLE-3) on a local simulated node.

One playbook run per module (it is the expensive part); the tests read what it printed and left.
The experiment carries hostile values (shell metacharacters) in an env variable and a server arg:
they must reach the engine literally, and nothing may be executed.
"""
from __future__ import annotations

import json
import re
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

import sys

from specab.analysis.findings import doctor
from tests.ansible.conftest import Result, SimNode, experiment, processes_mentioning
from tests.ansible.template_render import render

PWNED = Path(f"/tmp/specab-pwned-{uuid.uuid4().hex[:8]}")
HOSTILE_ENV = f"x; touch {PWNED}; $(touch {PWNED}) `touch {PWNED}`"
HOSTILE_NAME = f"kimi'; touch {PWNED} #"

EXPECTED_FILES = {"server.log", "bench.jsonl", "bench_summary.json", "launch.sh", "nccl.env", "manifest.json",
                  "gpu_before.csv", "gpu_after.csv", "gpu_samples.csv", "env_check.json", "server_info.json",
                  "stop.json", "gpu_free.json", "args.json", "ready.json"}


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def round_(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimNode, Result, dict[str, Any]]]:
    node = SimNode(root=tmp_path_factory.mktemp("ab-round"))
    exp = experiment(node.port)
    exp["env"]["SPECAB_TEST_HOSTILE"] = HOSTILE_ENV
    exp["server_args"]["served_model_name"] = HOSTILE_NAME
    # 128 tokens: at time scale 50 a 32-token baseline request streams in 7.5 ms of wall time, so one scheduling
    # stall of a few ms on a loaded box delivered both measured requests in bursts (no decode pace, no speedup)
    exp["bench"]["output_len"] = 128
    exp_file = node.write_experiment(exp)
    try:
        result = node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file),
                                               "specab_experiment_id": "t-round"})
        yield node, result, exp
    finally:
        node.stop()
        PWNED.unlink(missing_ok=True)


def _table(flat_output: str) -> dict[str, list[str]]:
    """Rows of the printed table: arm -> [requests, tok/s, TTFT ms, accept len, speedup]."""
    return {m.group(1): list(m.groups()[1:]) for m in re.finditer(
        r"(baseline|eagle3-s2) (\d+/\d+) ([\d.]+) ([\d.]+) ([\d.]+|-) ([\d.]+x|-)", flat_output)}


def test_round_succeeds_and_prints_the_table(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    node, result, _ = round_
    assert result.rc == 0, str(result)
    assert "arm requests tok/s (median) TTFT (ms) accept len speedup" in result.flat
    rows = _table(result.flat)
    assert set(rows) == {"baseline", "eagle3-s2"}, str(result)
    base, eagle = rows["baseline"], rows["eagle3-s2"]
    assert base[0] == "2/2" and eagle[0] == "2/2"
    assert float(base[1]) > 0 and float(eagle[1]) > 0
    assert base[3] == "-", "the baseline does not speculate: no accept length"
    assert 1.5 < float(eagle[3]) < 3.0, f"EAGLE-3 2-step accept length should be ~2.1, got {eagle[3]}"
    assert base[4] == "1.00x"
    table = {r["arm"]: r for r in json.loads((node.runs_dir / "t-round" / "ab_table.json").read_text())["rows"]}
    speedup = table["eagle3-s2"]["tok_s"] / table["baseline"]["tok_s"]
    assert eagle[4] == f"{speedup:.2f}x", "speedup = median tok/s of the arm / median tok/s of the baseline"


def _driver_stats(exp_file: Path, exp_dir: Path, store_path: Path) -> Any:
    """What `driver.py report` computes for the round's runs: the arms as the driver builds them, each run
    directory ingested into a results store as the driver records a finished run, the store loaded and analysed."""
    from specab.analysis.measures import stats
    from specab.analysis.evidence.model import load_store
    from specab.config.matrix import build_arms
    from specab.config.spec import load_experiment
    from specab.driver.record import ingest_run_dir
    from specab.results.store import Store

    spec = load_experiment(exp_file)
    arms = build_arms(spec, []).arms
    store = Store.create(store_path)
    try:
        store.write_experiment(id="t-round", name=spec.name, seed=1, repeats=1, order_mode="blocked",
                               experiment_file=str(exp_file), inventory_file="", config={}, matrix=[], argv=[],
                               hosts=["sim0"], specab_version=None, git_sha=None)
        store.write_arms([a.to_json() for a in arms])
        run_ids = ("001-baseline", "002-eagle3-s2")
        store.write_plan([{"seq": seq, "run_id": run_id, "block": 1, "position": seq, "arm": run_id[4:]}
                          for seq, run_id in enumerate(run_ids, start=1)], repeats=1)
        for seq, run_id in enumerate(run_ids, start=1):
            store.start_run(seq=seq, run_id=run_id, arm=run_id[4:], block=1, host="sim0",
                            run_dir=str(exp_dir / run_id), runner_ident=run_id)
            got = ingest_run_dir(store, seq, exp_dir / run_id, ["sim0"])
            store.finish_run(seq, status="ok", summary=got.get("summary"), server_info=got.get("server_info"))
    finally:
        store.close()
    exp = load_store(store_path)
    return exp, stats.analyse(exp)


def test_the_printed_table_is_the_drivers_analysis(round_: tuple[SimNode, Result, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    """The table ab_test.yml prints holds the numbers `driver.py report` computes from the same run directories
    (through a results store, as the driver records runs): tok/s (the median of the runs' median request decode
    rates, in the simulator's own seconds, not the time-scaled wall clock), TTFT, accept length and the paired
    speedup, and a line of why from the doctor."""
    node, result, _ = round_
    assert result.rc == 0, str(result)
    exp_dir = node.runs_dir / "t-round"
    exp, st = _driver_stats(node.root / "experiment.yml", exp_dir, tmp_path / "results.sqlite")
    rows = _table(result.flat)
    for arm, row in rows.items():
        a = st.arms[arm]
        assert row[1] == f"{a.tok_s_run.median:.1f}", (arm, row, a.tok_s_run)
        assert row[2] == f"{a.ttft_s.median * 1000:.0f}", (arm, row, a.ttft_s)
        assert row[3] == ("-" if a.accept_len.mean is None else f"{a.accept_len.mean:.2f}"), (arm, row)
    assert rows["eagle3-s2"][4] == f"{st.speedups['eagle3-s2'].estimate:.2f}x"
    assert 40 < st.arms["baseline"].tok_s_run.median < 200, "simulated seconds: the seed's ~82 tok/s baseline"
    # the callback prints the line as a YAML scalar: single-quoted (quotes doubled) where it holds ': '
    why = re.search(r"why: (.+?) \(doctor: (error|warning|info), ([a-z-]+)\)", result.flat.replace("''", "'"))
    assert why, result.flat[-3000:]
    top = doctor.diagnose(exp, st)[0]
    assert (why.group(2), why.group(3)) == (top.severity, top.rule)
    assert " ".join(top.message.split()).startswith(why.group(1)), (why.group(1), top.message)


def test_round_leaves_every_artefact(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    node, result, _ = round_
    assert result.rc == 0, str(result)
    exp_dir = node.runs_dir / "t-round"
    assert sorted(p.name for p in exp_dir.iterdir() if p.is_dir()) == ["001-baseline", "002-eagle3-s2"]
    for run in ("001-baseline", "002-eagle3-s2"):
        files = {p.name for p in (exp_dir / run).iterdir()}
        assert EXPECTED_FILES <= files, f"{run} misses {sorted(EXPECTED_FILES - files)}"
        assert (exp_dir / run / "nccl.env").stat().st_mode & 0o777 == 0o600
        records = [json.loads(line) for line in (exp_dir / run / "bench.jsonl").read_text().splitlines()]
        assert [r["warmup"] for r in records].count(False) == 2 and all(r["ok"] for r in records)
        manifest = json.loads((exp_dir / run / "manifest.json").read_text())
        assert "t-round" in json.dumps(manifest) and run in json.dumps(manifest)
    eagle_args = json.loads((exp_dir / "002-eagle3-s2" / "server_info.json").read_text())
    assert eagle_args["speculative_algorithm"] == "EAGLE3" and eagle_args["speculative_num_steps"] == 2
    table = json.loads((exp_dir / "ab_table.json").read_text())
    assert [r["arm"] for r in table["rows"]] == ["baseline", "eagle3-s2"]


def test_hostile_values_reach_the_engine_literally(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    node, result, _ = round_
    assert result.rc == 0, str(result)
    assert not PWNED.exists(), f"a templated value was executed: {PWNED} was created"
    run = node.runs_dir / "t-round" / "001-baseline"
    check = json.loads((run / "env_check.json").read_text())
    hostile = check["variables"]["SPECAB_TEST_HOSTILE"]
    assert hostile["mismatches"] == [] and any(e.startswith("environ:") for e in hostile["evidence"])
    info = json.loads((run / "server_info.json").read_text())
    assert info["served_model_name"] == HOSTILE_NAME


def test_round_leaves_nothing_running_and_testinfra_agrees(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    node, result, _ = round_
    assert result.rc == 0, str(result)
    assert node.server_record() is None, "server.json should be gone after the final stop"
    assert processes_mentioning(str(node.node_dir)) == [], "no process of the round (server, sampler) may be left"
    check = node.infra_check()
    assert check.rc == 0, f"testinfra should pass on free GPUs:\n{check}"
    assert "4 passed" in check.output


def test_ansible_and_plain_jinja_render_the_same_files(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    """The driver renders the templates with plain Jinja2 (`driver.py plan`) from the arms as it resolves them,
    in the spelling of the node's engine (the simulated SGLang 0.5.23's --help); what Ansible deployed must match,
    byte for byte (the order of the flags included)."""
    from specab.config.spec import load_experiment, resolve_arm
    from specab.driver.preflight import parse_help_flags
    from specab.vocab import engines

    node, result, exp = round_
    assert result.rc == 0, str(result)
    spec = load_experiment(node.root / "experiment.yml")
    flags = parse_help_flags(subprocess.run([sys.executable, "-m", "specab.sim.launch_server", "--help"],
                                            capture_output=True, text=True, check=True).stdout)
    for index, run in enumerate(("001-baseline", "002-eagle3-s2")):
        logical = resolve_arm(spec, spec.arms[index])
        arm = replace(logical, node_args=engines.spell_for("sglang", logical.server_args, flags)).to_extravar()
        assert "cuda_graph_max_bs_decode" in arm["server_args"] and "cuda_graph_max_bs" not in arm["server_args"]
        ctx = {"specab_arm": arm, "specab_run_id": run, "specab_node_env": node.node_env(),
               "specab_engine_cmd": [sys.executable, "-m", "specab.sim.launch_server"]}
        run_dir = node.runs_dir / "t-round" / run
        assert (run_dir / "launch.sh").read_text() == render("launch_server.sh.j2", **ctx)
        assert (run_dir / "nccl.env").read_text() == render("nccl.env.j2", **ctx)


def test_round_takes_and_releases_the_node_lease(round_: tuple[SimNode, Result, dict[str, Any]]) -> None:
    node, result, _ = round_
    assert result.rc == 0, str(result)
    assert "Lease | Take the node lease" in result.flat and "Lease | Release the node lease" in result.flat
    assert not (node.node_dir / "experiment.lease").exists(), "the round kept the node lease"


# --------------------------------------------------------------------------- what `make demo` shows

DEMO_LINES_MAX = 40


def _readme_demo_transcript() -> list[str]:
    """The README's `make demo` transcript: the code block after "A real run" in "Two commands on a fresh machine"."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = readme.split("A real run", 1)[1]
    return after.split("```\n", 2)[1].rstrip("\n").split("\n")


def _makefile_banner() -> str:
    """The line `make demo` echoes before the playbook's view (the Makefile's own words)."""
    mk = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    return re.search(r'^\t@echo "(specab demo: [^"]*)"$', mk, re.M).group(1)


def _shape(lines: list[str]) -> list[str]:
    """Lines with what differs between two rounds masked: the experiment id and file, paths, numbers; the
    announcement (the callback wraps it where its length says) joined into one line; blanks collapsed."""
    start = next(i for i, x in enumerate(lines) if x.startswith("Experiment "))
    end = next(i for i, x in enumerate(lines) if i > start and x.startswith("  Start | "))
    lines = lines[:start] + [" ".join(lines[start:end])] + lines[end:]
    out = []
    for line in lines:
        line = re.sub(r"^Experiment \S+ \(\S+\):", "Experiment <id> (<file>):", line)
        line = re.sub(r"(artefacts in|full Ansible output:) \S+", r"\1 <path>", line)
        line = re.sub(r"^why: .*", "why: <the doctor's top finding>", line)     # it depends on the experiment
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        out.append(" ".join(line.split()))
    return out


def test_make_demo_view_is_the_readme_transcript(round_: tuple[SimNode, Result, dict[str, Any]], tmp_path) -> None:
    """`make demo` pipes ab_test.yml's Ansible output through scripts/demo_view.py. Fed this round's real output,
    the view is at most 40 lines with the results table and the path of the round's results, keeps the whole output
    in its log, and has the shape of the README's transcript: the same lines, the same table header, numbers aside."""
    node, result, _ = round_
    assert result.rc == 0, str(result)
    log = tmp_path / "demo-ansible.log"
    view = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "scripts" / "demo_view.py"),
                           str(log)], input=result.output, capture_output=True, text=True, timeout=60)
    assert view.returncode == 0 and view.stderr == "", view.stderr
    shown = [_makefile_banner()] + view.stdout.rstrip("\n").split("\n")
    assert len(shown) <= DEMO_LINES_MAX, "\n".join(shown)
    assert log.read_text() == result.output, "the log must keep the whole Ansible output"
    assert len(result.output.splitlines()) > 4 * len(shown)       # what the view spares the reader
    readme = _readme_demo_transcript()
    header = next(x for x in readme if x.startswith("arm "))
    assert header in shown, "\n".join(shown)                       # the same table header, column for column
    rows = _table(" ".join(view.stdout.split()))
    assert set(rows) == {"baseline", "eagle3-s2"} and rows["baseline"][4] == "1.00x", view.stdout
    artefacts = next(x for x in shown if x.startswith("artefacts in "))
    exp_dir = Path(artefacts.split(" ", 2)[2])
    assert exp_dir == node.runs_dir / "t-round" and (exp_dir / "ab_table.json").is_file(), artefacts
    assert shown[-1] == f"full Ansible output: {log}"
    assert _shape(shown) == _shape(readme), "\n".join(shown)


def test_a_sampler_slower_to_start_than_the_benchmark_still_samples(tmp_path: Path) -> None:
    """The bench step (specab/node/benchstep.py) starts its client only once the GPU sampler has written its CSV
    header: a sampler that takes 3 s to start (a loaded node importing Python; here a wrapper that waits before the
    interpreter of the sampler's process, ``python -c ... ROOT gpusample``) against a benchmark of about a second
    still leaves gpu_samples.csv with samples in every run."""
    wrapper = tmp_path / "slow-sampler-python"
    wrapper.write_text("#!/bin/sh\n"
                       'case "$*" in *" gpusample") sleep 3 ;; esac\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    node = SimNode(root=tmp_path / "node-root")
    node.write_inventory(specab_bench_python=str(wrapper))
    try:
        result = node.playbook("ab_test.yml", {"specab_experiment_file": str(node.write_experiment(
            experiment(node.port))), "specab_experiment_id": "t-slow-sampler"})
        assert result.rc == 0, str(result)
        for run in ("001-baseline", "002-eagle3-s2"):
            csv_text = (node.runs_dir / "t-slow-sampler" / run / "gpu_samples.csv").read_text()
            assert csv_text.startswith("timestamp,") and len(csv_text.splitlines()) >= 2, (run, csv_text)
    finally:
        node.stop()
