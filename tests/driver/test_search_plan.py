"""`--search` and `--slo` on the command line: refused before anything runs when they cannot work, and `driver.py plan
--search` shows the search's probes and their expected GPU-minutes without touching a node."""
from __future__ import annotations

import pytest

from specab.driver.session import stored_search_options
from tests.driver.conftest import EXPERIMENT
from tests.driver.test_cli_plan import inventory, no_processes, run_cli  # noqa: F401,F811  (fixtures)

WITH_SLO = EXPERIMENT.replace("  timeouts:", "  slo:\n    tpot_ms: {p95: 10}\n  timeouts:").replace(
    "num_requests: 3", "num_requests: 24")


@pytest.mark.parametrize("args, message", [
    (["--search", "steps"], "'steps' is not a load"),
    (["--search", "request_rate=8..2"], "the range is LO..HI with 0 < LO < HI"),
    (["--search", "concurrency=1.5..8"], "whole numbers for concurrency"),
    (["--search", "request_rate", "--matrix", "request_rate=2,4"], "drop --matrix request_rate"),
    (["--search", "concurrency", "--matrix", "request_rate=2,4"], "drop --matrix request_rate"),
    (["--search", "request_rate", "--target-ci", "2%"], "cannot be combined with --target-ci"),
    (["--search-tol", "10%"], "--search-tol is the tolerance of a capacity search"),
    (["--slo", "ttft:p95=200"], "did you mean 'ttft_ms'"),
    (["--slo", "ttft_ms:p95=0"], "must be a positive number"),
    (["--slo", "tpot_ms:p0=10"], "(0, 100]"),
])
def test_refused_before_anything_runs(write, inventory, no_processes, capsys, args, message):  # noqa: F811
    inv, node_dir = inventory
    exp = write("exp.yml", WITH_SLO)
    code, _ = run_cli("--runs-dir", str(exp.parent / "runs"), "-e", str(exp), "-i", str(inv), *args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Nothing was started." in err, err
    assert not node_dir.exists() and not (exp.parent / "runs").exists()


def test_a_search_without_an_slo_is_refused(write, inventory, no_processes, capsys):  # noqa: F811
    inv, _ = inventory
    exp = write("exp.yml", EXPERIMENT.replace("num_requests: 3", "num_requests: 24"))
    code, _ = run_cli("-e", str(exp), "-i", str(inv), "--search", "request_rate")
    err = capsys.readouterr().err
    assert code == 2 and "a capacity search finds the highest load that meets an SLO" in err
    assert "--slo ttft_ms:p95=200" in err


def test_plan_shows_the_ladder_the_later_probes_and_their_gpu_minutes(write, inventory, no_processes):  # noqa: F811
    inv, node_dir = inventory
    exp = write("exp.yml", WITH_SLO)
    code, out = run_cli("plan", "-e", str(exp), "-i", str(inv), "--search", "request_rate=2..16", "--search-tol",
                        "20%", "--slo", "ttft_ms:p95=200", "--runs-dir", str(exp.parent / "runs"))
    assert code == 0, out
    assert ("--search request_rate=2..16 (tolerance 20%: grid step x1.189), SLO p95 TTFT <= 200 ms and p95 TPOT <= "
            "10 ms") in out
    assert "block 1 (the ladder): 2, 4, 8, 16 req/s x 2 arms = 8 runs;" in out
    assert "at most 4 loads x 2 arms = 8 runs" in out and "expected 3 blocks" in out
    assert "GPU-minutes (block 1:" in out and "simulator profile" in out
    # block 1's runs, each an ordinary arm of the matrix: the arm --matrix request_rate=2 would make
    for name in ("baseline-r2", "eagle3-s2-r2", "baseline-r16", "eagle3-s2-r16"):
        assert f"=== arm {name} " in out
    assert not node_dir.exists()


def test_a_resume_goes_on_with_the_stored_search():
    argv = ["--search", "request_rate=2..16", "--search-tol", "20%", "--slo", "ttft_ms:p95=200",
            "--slo=tpot_ms:p95=10"]
    assert stored_search_options(argv + ["--repeats", "4"]) == {
        "search": "request_rate=2..16", "search_tol": pytest.approx(0.2), "slo": ["ttft_ms:p95=200", "tpot_ms:p95=10"],
        "blocks": (4, None)}       # the bracketed blocks it wants: the store's repeats count those planned so far
    assert stored_search_options(argv + ["--max-repeats", "5"])["blocks"] == (3, 5)
    assert stored_search_options(["--matrix", "steps=2", "--repeats", "2"]) == {
        "search": None, "search_tol": None, "slo": [], "blocks": (None, None)}
