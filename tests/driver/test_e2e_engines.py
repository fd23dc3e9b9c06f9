"""The engine axis end to end on the simulated node: the originating log's experiment (experiments/default.yml) on
BOTH SGLang releases the simulator plays, as one engine A/B (`--matrix engine=sglang-0.5.9,sglang-0.5.23`)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from specab.results import store as st
from tests.driver.simnode import PYTHON, REPO, SimNode, driver, free_port, reap_driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BUILDS = {"sglang-0.5.9": "0.5.9", "sglang-0.5.23": "0.5.23"}


def test_default_experiment_on_both_simulated_releases_as_an_engine_ab(tmp_path: Path):
    node = SimNode(root=tmp_path, port=free_port(), time_scale="10", profile="instant")
    try:
        # the default experiment as shipped, on a private port (other checkouts may use 30000)
        exp = yaml.safe_load((REPO / "experiments" / "default.yml").read_text())
        exp["specab_experiment"]["server_args"]["port"] = node.port
        exp_file = tmp_path / "default.yml"
        exp_file.write_text(yaml.safe_dump(exp))
        hv = node.host_vars()
        hv["specab_engines"] = {b: {"env": {"SPECAB_SIM_SGLANG_VERSION": v}} for b, v in BUILDS.items()}
        inv = node.write_inventory(hv)
        proc = driver("--matrix", "engine=" + ",".join(BUILDS), "--repeats", "1", "-e", str(exp_file), "-i", str(inv),
                      "--runs-dir", str(node.runs_dir), env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        try:
            out, _ = proc.communicate(timeout=1000)
        finally:
            reap_driver(proc, 60)
        assert proc.returncode == 0, out[-4000:]
        exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
        s = st.Store.open(exp_dir)
        runs = {r["arm"]: r for r in s.runs()}
        assert set(runs) == {f"{a}-{b}" for a in ("baseline", "eagle3-s2") for b in BUILDS}
        assert all(r["status"] == "ok" for r in runs.values())
        fingerprints = set()
        for build, version in BUILDS.items():
            for arm in ("baseline", "eagle3-s2"):
                rd = exp_dir / runs[f"{arm}-{build}"]["run_id"]
                man = json.loads((rd / "manifest.json").read_text())
                assert man["engine"]["build"] == build and man["engine"]["version"] == version, man["engine"]
                assert man["engine"]["generation"] == version and man["engine"]["version_source"] == "server_info"
                fingerprints.add((build, man["engine"]["flags_fingerprint"]))
                assert json.loads((rd / "server_info.json").read_text())["version"] == version
                env_check = json.loads((rd / "env_check.json").read_text())
                assert env_check["engine"]["generation"] == version
                # the engine's own shutdown, recorded by the sequencer's stop (it is the server's parent)
                shutdown = json.loads((rd / "stop.json").read_text())["shutdown"]
                assert shutdown["style"] == ("shutdown-req" if version == "0.5.23" else "tree-kill"), shutdown
                assert shutdown["main_exit"]["status"] == (0 if version == "0.5.23" else -9)
                assert json.loads((rd / "gpu_free.json").read_text())["ok"] is True
        assert len({fp for _, fp in fingerprints}) == 2, "each build's own --help flag set"
        # per-engine baseline and speedup
        rep = json.loads((exp_dir / "report.json").read_text())
        sp = rep["stats"]["speedups"]
        assert {a: v["baseline"] for a, v in sp.items()} == {f"eagle3-s2-{b}": f"baseline-{b}" for b in BUILDS}
        assert all(v["estimate"] > 0 for v in sp.values())
        # one spec model per engine build, each over that build's own arm (report.json "models")
        models = rep["models"]
        assert set(models) == {f"baseline-{b}" for b in BUILDS}
        for b in BUILDS:
            m = models[f"baseline-{b}"]
            assert [a["name"] for a in m["arms"]] == [f"eagle3-s2-{b}"] and m["arms"][0]["steps"] == 2
            assert m["baseline_tok_s"] == pytest.approx(rep["stats"]["arms"][f"baseline-{b}"]["tok_s_run"]["median"])
        assert rep["model"] == models[next(iter(models))]
        # diff of the two baselines names the version change
        d = subprocess.run([PYTHON, str(REPO / "driver.py"), "diff", "--format", "json",
                            str(exp_dir / runs["baseline-sglang-0.5.9"]["run_id"]),
                            str(exp_dir / runs["baseline-sglang-0.5.23"]["run_id"])],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, d.stderr
        diffs = {(x["category"], x["key"]): (x["a"], x["b"]) for x in json.loads(d.stdout)["differences"]}
        assert diffs[("engine", "version")] == ("0.5.9", "0.5.23")
    finally:
        node.cleanup()
