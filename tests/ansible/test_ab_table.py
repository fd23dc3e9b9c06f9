"""The results table that ab_test.yml prints (specab/analysis/render/abtable.py through the specab_ab_table lookup),
from run directories written here the way a round leaves them.

What a user relies on: the driver's numbers (a run's tok/s is the median of its measured requests' decode rates,
warm-ups left out; a simulated node's time scale undone), the paired speedup against the baseline, a rate that
is not there shown as '-', never as 0.0, and a line that says why (the doctor's top finding)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader

from specab.analysis.render import abtable

REPO = Path(__file__).resolve().parents[2]
BASE_ARGS = {"model_path": "/models/m", "tp_size": 1}
EAGLE = {**BASE_ARGS, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 2}


def write_run(run_dir: Path, decode: list[float | None], *, accept: float | None = None, scale: float = 1.0,
              ttft_s: float = 0.03, engine: float | None = None) -> None:
    """A run directory: one warm-up request (an outlier the table must leave out) and the measured ones, each
    with its decode rate (None: delivered in a burst, no rate), times as a node at time scale `scale` measures;
    `engine`: the engine's own decode rate over the measured requests (vLLM's /metrics, engine_decode)."""
    run_dir.mkdir(parents=True)
    lines = [{"i": 0, "warmup": True, "ok": True, "output_tokens": 32, "ttft_s": 0.001, "decode_tok_s": 9999.0}]
    for i, rate in enumerate(decode, start=1):
        lines.append({"i": i, "warmup": False, "ok": True, "start_ts": 1000.0 + i, "output_tokens": 32,
                      "ttft_s": ttft_s / scale, "e2e_s": 1.0 / scale, "decode_tok_s": None if rate is None else rate * scale,
                      "spec_verify_ct": None if accept is None else round(32 / accept), "accept_len": accept})
    (run_dir / "bench.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    buffered = sum(1 for r in decode if r is None)
    summary: dict[str, Any] = {"requests": len(decode), "ok": len(decode), "buffered_requests": buffered}
    if engine is not None:
        summary["engine_decode"] = {"requests": len(decode), "decode_tok_s": engine * scale, "source": "metrics"}
    (run_dir / "bench_summary.json").write_text(json.dumps(summary))
    (run_dir / "server_info.json").write_text(json.dumps({"simulator": {"time_scale": scale}} if scale != 1.0 else {}))


def lines_of(tmp_path: Path, arms: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The table through the playbook's own entry point, the specab_ab_table lookup, as ab_test.yml calls it."""
    lookup = lookup_loader.get("specab_ab_table", loader=DataLoader(), templar=None)
    assert lookup is not None, "ansible does not find playbooks/lookup_plugins/specab_ab_table.py"
    out = lookup.run([], {}, experiment_id="t", exp_dir=str(tmp_path), host_suffix="",
                     arms=[{"name": n, "server_args": a, "env": {}} for n, a in arms],
                     baselines={n: ("baseline" if "speculative_algorithm" in a else n) for n, a in arms})
    return out[0]["lines"], out[0]["rows"]


def setup_module() -> None:
    lookup_loader.add_directory(str(REPO / "playbooks" / "lookup_plugins"))


def test_run_medians_and_the_paired_speedup_in_simulated_seconds(tmp_path: Path) -> None:
    # at time scale 50 the node measured 50 x the simulated rates; the table shows the simulated ones
    write_run(tmp_path / "001-baseline", [40.0, 41.1, 50.0], scale=50.0)
    write_run(tmp_path / "002-eagle3-s2", [60.5, 55.0, 70.0], accept=2.0, scale=50.0, ttft_s=0.045)
    lines, rows = lines_of(tmp_path, [("baseline", BASE_ARGS), ("eagle3-s2", EAGLE)])
    assert lines[0] == "arm               requests tok/s (median)  TTFT (ms)  accept len   speedup  outputs"
    assert lines[1].split() == ["baseline", "3/3", "41.1", "30", "-", "1.00x", "-"]
    # these runs recorded no outputs (bench.jsonl without output_ids): the outputs are unchecked, and said so
    assert lines[2].split() == ["eagle3-s2", "3/3", "60.5", "45", "2.00", "1.47x", "unchecked"]
    assert lines[3] == ("speedup = tok/s / tok/s of arm baseline in this round (driver.py report's paired speedup); "
                        "outputs = each request's output against the baseline's on the same prompt")
    assert lines[4] == "verdict: eagle3-s2: 1.47x, outputs not checked (no outputs recorded)"
    assert lines[5].startswith("why: ") and "(doctor: " in lines[5]
    assert lines[6] == f"artefacts in {tmp_path}"
    assert rows[1]["speedup"] == rows[1]["tok_s"] / rows[0]["tok_s"] and rows[1]["speculative"] is True


def test_a_missing_rate_is_a_dash_never_zero_and_the_why_says_so(tmp_path: Path) -> None:
    # every baseline request reached the client in a burst (a starved API server): no rate, so no speedup either
    write_run(tmp_path / "001-baseline", [None, None, None])
    write_run(tmp_path / "002-eagle3-s2", [60.5, 55.0, 70.0], accept=2.0)
    lines, rows = lines_of(tmp_path, [("baseline", BASE_ARGS), ("eagle3-s2", EAGLE)])
    assert lines[1].split() == ["baseline", "3/3", "-", "30", "-", "-", "-"]
    assert lines[2].split() == ["eagle3-s2", "3/3", "60.5", "30", "2.00", "-", "unchecked"]
    assert rows[0]["tok_s"] is None and rows[0]["buffered"] == 3
    why = next(line for line in lines if line.startswith("why: "))
    assert why.startswith("why: baseline: 3 of 3 measured requests reached the client in bursts"), why
    assert why.endswith("(doctor: warning, bursty-delivery)"), why


def test_a_run_the_client_could_not_time_shows_the_engines_own_rate(tmp_path: Path) -> None:
    # the same starved baseline on a vLLM that reports its own decode rate: the table shows that rate and the
    # speedup against it; the why names the runs whose rate came from the engine
    write_run(tmp_path / "001-baseline", [None, None, None], engine=40.0)
    write_run(tmp_path / "002-eagle3-s2", [60.5, 55.0, 70.0], accept=2.0)
    lines, rows = lines_of(tmp_path, [("baseline", BASE_ARGS), ("eagle3-s2", EAGLE)])
    assert lines[1].split() == ["baseline", "3/3", "40.0", "30", "-", "1.00x", "-"]
    assert lines[2].split() == ["eagle3-s2", "3/3", "60.5", "30", "2.00", "1.51x", "unchecked"]
    assert rows[0]["tok_s"] == rows[0]["engine_tok_s"] == 40.0
    why = next(line for line in lines if line.startswith("why: "))
    assert "001-baseline had no request the client could time" in why, why


def test_a_second_arm_without_speculation_is_a_baseline_of_its_own(tmp_path: Path) -> None:
    # as in the driver's report: only speculative arms get a paired speedup
    write_run(tmp_path / "001-baseline", [40.0, 41.1, 50.0])
    write_run(tmp_path / "002-baseline-tp2", [45.0, 46.0, 47.0])
    lines, _ = lines_of(tmp_path, [("baseline", BASE_ARGS), ("baseline-tp2", {**BASE_ARGS, "tp_size": 2})])
    assert lines[1].split()[-2:] == ["1.00x", "-"] and lines[2].split()[-2:] == ["-", "-"]
