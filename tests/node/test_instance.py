"""One server across the loads of an instance (docs/decisions/0011) on the node: the sequencer runs an instance's
runs on one server start, resets the engine's cache before each load after the first, gives each run its part of the
server's log (a failed run ends its instance: tests/driver/test_e2e_instances.py). The simulator's own records are the truth: its launch counter
(``<state>/instances``) and its /flush_cache record (``<state>/flushes.jsonl``).

Laid out as enqueue.yml does (tests/node/seqnode.py); `instant` profile, TP 2, time scale 10.
"""
from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from specab.node import instance
from tests.node.seqnode import BENCH, SeqNode, wait_for

LOAD_LINE = "The server is fired up and ready to roll!"
FLUSH_LINE = "Cache flushed successfully!"


@pytest.fixture
def node(tmp_path: Path):
    n = SeqNode(tmp_path)
    yield n
    n.cleanup()


def _launches(node: SeqNode) -> int:
    return int((node.state / "instances").read_text())


def _flushes(node: SeqNode) -> list[dict]:
    path = node.state / "flushes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _instance_runs(node: SeqNode, loads: list[int], keeps: list[bool], first_seq: int = 1) -> list[str]:
    """Runs of an instance of one arm at `loads` (each run's bench concurrency), queued in one batch: their ids."""
    runs = []
    for i, (c, keep) in enumerate(zip(loads, keeps)):
        arm = dict(node.arm("baseline"), name=f"baseline-c{c}")
        runs.append(node.batch_run(first_seq + i, arm, dict(BENCH, concurrency=c),
                                   instance={"id": "1", "keep": keep, "engine": "sglang"}))
    r = node.stage(runs)
    assert r.rc == 0, r.data
    return [run["run_id"] for run in runs]


def _text(node: SeqNode, run_id: str, name: str) -> str:
    return node.run_file(run_id, name).read_text()


def test_an_instance_runs_its_loads_on_one_start_with_the_cache_reset_before_each_later_load(node):
    ids = _instance_runs(node, [1, 2], [True, True])
    assert node.ensure().rc == 0
    for rid in ids:
        w = node.wait(rid)
        assert (w.data["ok"], w.data["status"]) == (True, "ok"), w.data
    # between two loads the server is kept: SGLang (and the simulator) refuse the reset while a request runs, and the
    # node asks again until it is done
    refused = _reset_while_busy(node)
    ids += _instance_runs(node, [4], [False], first_seq=3)
    w = node.wait(ids[-1])
    assert (w.data["ok"], w.data["status"]) == (True, "ok"), w.data
    # the simulator started one server, and answered the cache resets of that server: done before each later load
    assert _launches(node) == 1
    assert [(f["instance"], f["ok"]) for f in _flushes(node)] == \
        [(0, True)] + [(0, False)] * refused + [(0, True), (0, True)]
    first, second, last = ids
    records = {rid: json.loads(_text(node, rid, "instance.json")) for rid in ids}
    assert [r["continued"] for r in records.values()] == [False, True, True]
    assert {r["started_run_id"] for r in records.values()} == {first}
    assert len({r["pid"] for r in records.values()}) == 1
    # the reset before each later load: read from the engine's own route list, done at the first ask
    for rid in (second, last):
        reset = json.loads(_text(node, rid, "cache_reset.json"))
        assert (reset["ok"], reset["path"], reset["routes"], reset["status"]) == \
            (True, "/flush_cache", "/openapi.json", 200), reset
        assert reset["answer"].startswith("Cache flushed.")
    assert not node.run_file(first, "cache_reset.json").exists()
    # each run's server.log is its own part of the one server's log: the load in the first, one reset in each other
    logs = {rid: _text(node, rid, "server.log") for rid in ids}
    assert [logs[r].count(LOAD_LINE) for r in ids] == [1, 0, 0]
    # (the third part begins where the second run handed the server over: the test's own reset is in it)
    assert [logs[r].count(FLUSH_LINE) for r in ids] == [0, 1, 2]
    assert logs[last].count("Cache not flushed because there are pending requests") == refused
    assert all(logs[r].count('"POST /generate HTTP/1.1" 200') >= 3 for r in ids)  # its warm-up and measured requests
    # the steps skipped by a run that continues its instance, and the stop kept for the next one
    phases = {rid: [p["phase"] for p in node.phases(rid)] for rid in ids}
    assert phases[first][-4:] == ["benchmarking", "stopping", "manifest", "done"]
    assert "ready" in phases[first] and "gpus free" not in phases[first]
    for rid in (second, last):
        assert phases[rid][:4] == ["claimed", "stopping-leftover", "starting", "loading"], phases[rid]
        assert "gpus-free-before" not in phases[rid] and "ready" not in phases[rid]
    assert phases[last][-4:] == ["stopping", "gpus free", "manifest", "done"]
    # only the last run stopped the server, and its GPUs are verified free
    assert [node.run_file(r, "stop.json").exists() for r in ids] == [False, False, True]
    assert json.loads(_text(node, last, "gpu_free.json"))["ok"]
    done = [json.loads(_text(node, r, "done.json")) for r in ids]
    assert done[0]["time_to_ready_s"] > 0 and done[1]["time_to_ready_s"] is None and done[2]["stop_s"] > 0
    assert not (node.node_dir / "server.json").exists()
    assert not (node.node_dir / instance.INSTANCE_LOG).exists()


def _reset_while_busy(node: SeqNode) -> int:
    """A reset asked while a long request runs on the kept server: refused, asked again, done once the request ended.
    Returns how often the engine refused it."""
    url = f"http://127.0.0.1:{node.port}"
    body = json.dumps({"text": "hold the engine", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}})
    req = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    held = threading.Thread(target=lambda: urllib.request.urlopen(req, timeout=120).read(), daemon=True)
    held.start()
    assert wait_for(lambda: _busy(url) > 0, 30), "the request never reached the engine"
    out = instance.reset_cache(url, "sglang", timeout=60, interval=0.05)
    held.join(120)
    assert out["ok"] and out["refused"] >= 1 and out["attempts"] == out["refused"] + 1, out
    return int(out["refused"])


def _busy(url: str) -> int:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as resp:
        return int(json.load(resp)["internal_states"][0]["load"])
