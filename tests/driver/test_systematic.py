"""The systematic-failure rule: which failures stop an experiment and which do not."""
from __future__ import annotations

from typing import Any

from specab.driver.systematic import FailFast, startup_cause
from specab.results import store as st

OOM = ("The server on vm did not become ready: the server failed to start "
       "(out of memory) after {t}s: 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'. "
       "Log tail of /tmp/n/runs/{run}/server.log:\n[{ts} TP0] Scheduler hit an exception")
PORT = ("Starting arm {arm} on vm failed: port {port} is already taken (LISTEN) by PID {pid} at {ts}: "
        "ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use")


def row(seq: int, arm: str, status: str = st.FAILED, reason: str | None = None, phase: str | None = "loading",
        started: float = 100.0) -> dict[str, Any]:
    run_id = f"{seq:03d}-{arm}"
    return {"seq": seq, "run_id": run_id, "arm": arm, "status": status, "started": started + seq,
            "finished": started + seq + 0.5, "failure_phase": phase if status == st.FAILED else None,
            "failure_reason": (reason or "").format(run=run_id, arm=arm, t=seq * 1.3, ts=f"2026-12-01 10:0{seq}:00",
                                                    pid=4000 + seq, port=30000 + seq)}


def test_normalised_cause_drops_what_differs_between_runs():
    a = startup_cause(row(1, "baseline", reason=PORT)["failure_reason"], "001-baseline", "baseline")
    b = startup_cause(row(5, "eagle3-s2", reason=PORT)["failure_reason"], "005-eagle3-s2", "eagle3-s2")
    assert a == b
    for gone in ("4001", "30001", "10:01", "baseline"):
        assert gone not in a, a
    assert "address already in use" in a
    # the quoted log tail is not part of the cause (its lines carry timestamps and other ranks' lines)
    c = startup_cause(row(2, "baseline", reason=OOM)["failure_reason"], "002-baseline", "baseline")
    assert "Log tail" not in c and "CUDA out of memory" in c and "Tried to allocate <n> GiB" in c


CUDA_OOM = ("The server on vm did not become ready: the server failed to start (out of memory) after {t}s: "
            "'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity "
            "of 139.81 GiB of which {free} MiB is free.'")


def test_failures_that_differ_only_in_a_gpu_index_are_one_cause_and_stop():
    """`CUDA_VISIBLE_DEVICES` with too few GPUs for the TP size: every arm's server dies with CUDA out of memory on
    another GPU (another index, another free size). One cause: the experiment stops instead of playing every
    remaining run into it."""
    ff = FailFast(arms=frozenset({"baseline", "s2"}), since=0)
    runs = [row(1, "baseline", reason=CUDA_OOM.replace("{gpu}", "4").replace("{free}", "120.00")),
            row(2, "s2", reason=CUDA_OOM.replace("{gpu}", "6").replace("{free}", "98.50"))]
    stop = ff.check(runs)
    assert stop is not None and stop.runs == ["001-baseline", "002-s2"], stop
    assert "GPU <n> has a total capacity of <n> GiB" in stop.cause


def test_every_arm_failing_at_start_up_for_one_cause_stops():
    ff = FailFast(arms=frozenset({"baseline", "s2", "s3"}), since=0)
    runs = [row(1, "s2", reason=OOM), row(2, "baseline", reason=OOM)]
    assert ff.check(runs) is None                       # one arm has not run yet
    runs.append(row(3, "s3", reason=OOM))
    stop = ff.check(runs)
    assert stop is not None and stop.runs == ["001-s2", "002-baseline", "003-s3"]
    assert "CUDA out of memory" in stop.cause
    text = stop.message("exp-1", 6, "python driver.py --resume exp-1")
    assert "6 remaining run(s) were not run" in text and "--resume exp-1" in text and "hit 3 run(s)" in text


def test_different_causes_an_ok_run_or_a_failure_after_start_up_do_not_stop():
    arms = frozenset({"baseline", "s2"})
    ff = FailFast(arms=arms, since=0)
    assert ff.check([row(1, "s2", reason=OOM), row(2, "baseline", reason=PORT)]) is None
    # an arm whose latest run was ok works: no systematic failure
    assert ff.check([row(1, "s2", reason=OOM), row(2, "baseline", reason=OOM), row(3, "s2", st.OK)]) is None
    # failures during the benchmark are no start-up failures
    assert ff.check([row(1, "s2", reason=OOM, phase="benchmarking"),
                     row(2, "baseline", reason=OOM, phase="benchmarking")]) is None
    # runs of an earlier session (before `since`) do not count
    late = FailFast(arms=arms, since=102.5)
    assert late.check([row(1, "s2", reason=OOM), row(2, "baseline", reason=OOM), row(3, "s2", reason=OOM)]) is None
    # the same failure once in a one-arm experiment is not yet systematic
    one = FailFast(arms=frozenset({"baseline"}), since=0)
    assert one.check([row(1, "baseline", reason=OOM)]) is None
    assert one.check([row(1, "baseline", reason=OOM), row(2, "baseline", reason=OOM)]) is not None


def test_a_fleet_host_is_judged_on_its_own_runs():
    ff = FailFast(arms=frozenset({"baseline", "s2"}), since=0, host="h1")
    runs = [dict(row(1, "s2", reason=OOM), host="h1"), dict(row(2, "baseline", reason=OOM), host="h2")]
    assert ff.check(runs) is None
    runs.append(dict(row(3, "baseline", reason=OOM), host="h1"))
    assert ff.check(runs) is not None
