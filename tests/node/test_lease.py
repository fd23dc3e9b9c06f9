"""The node lease (specab/node/lease.py): one experiment per node directory, a second
controller refused naming the holder, stale leases broken with a notice, release only by the holder.
The tool runs as the driver runs it: a ``python -c`` program carrying it, with its ``LeaseSpec`` as ``--spec-json``
(no deployed node tools needed)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from specab.config import defaults
from specab.config.inventory import Host
from specab.driver.lease import LeaseError, LeaseHeld, NodeLeases, lease_argv
from specab.node.lease import LeaseSpec

FIELDS = {"--holder": ("holder", json.loads), "--stale-s": ("stale_s", float), "--token": ("token", str)}


def tool(node_dir: Path, command: str, *flags: str) -> tuple[int, dict]:
    """The lease tool as the driver calls it, its spec's fields given as the tool's flags; ``take`` and ``show`` get
    roles/specab's stale age unless given."""
    fields = {FIELDS[k][0]: FIELDS[k][1](v) for k, v in zip(flags[::2], flags[1::2])}
    if command in ("take", "show"):
        fields.setdefault("stale_s", float(defaults.get("lease_stale_s")))
    p = subprocess.run(lease_argv(sys.executable, LeaseSpec(node_dir=str(node_dir), command=command, **fields)),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout)


def test_the_flags_and_the_spec_are_one_call_and_a_bad_spec_is_a_usage_error(tmp_path: Path):
    d = tmp_path / "node"
    by_flags = subprocess.run([sys.executable, "-m", "specab.node", "lease", "--node-dir", str(d), "take",
                               "--holder", holder("exp-a", "t1"), "--stale-s", "600"],
                              capture_output=True, text=True, timeout=60)
    assert by_flags.returncode == 0 and json.loads(by_flags.stdout)["taken"], by_flags.stderr
    rc, out = tool(d, "take", "--holder", holder("exp-a", "t1"))
    assert rc == 0 and out["already"]
    spec = json.dumps({"node_dir": str(d), "command": "touch"})
    p = subprocess.run([sys.executable, "-m", "specab.node", "lease", "--spec-json", spec], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "touch needs token" in json.loads(p.stdout)["error"]
    p = subprocess.run([sys.executable, "-m", "specab.node", "lease", "--spec-json",
                        json.dumps({"node_dir": str(d), "command": "show", "stale": 1})],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown: stale" in json.loads(p.stdout)["error"]


def holder(exp: str, token: str, pid: int | None = None, host: str = "ctl-a") -> str:
    return json.dumps({"experiment_id": exp, "controller_host": host, "controller_pid": pid or 4242,
                       "started_at": 1.0, "started_at_iso": "2026-12-01T10:00:00+0000", "token": token})


def test_second_holder_refused_naming_the_first_then_released(tmp_path: Path):
    d = tmp_path / "node"
    rc, out = tool(d, "take", "--holder", holder("exp-a", "t1"))
    assert rc == 0 and out["taken"] and (d / "experiment.lease").exists()
    rc, out = tool(d, "take", "--holder", holder("exp-b", "t2", host="ctl-b"))
    assert rc == 1 and out["held"] and out["holder"]["experiment_id"] == "exp-a"
    assert "exp-a" in out["error"] and "ctl-a" in out["error"] and "4242" in out["error"]
    assert "2026-12-01T10:00:00" in out["error"]
    rc, out = tool(d, "release", "--token", "t2")        # not the holder: nothing released
    assert rc == 0 and out["released"] is False
    rc, out = tool(d, "take", "--holder", holder("exp-a", "t1"))     # the holder again: idempotent
    assert rc == 0 and out.get("already")
    assert tool(d, "touch", "--token", "t1")[0] == 0
    assert tool(d, "touch", "--token", "t2")[0] == 1                  # touch by a non-holder: lost
    rc, out = tool(d, "release", "--token", "t1")
    assert rc == 0 and out["released"] and not (d / "experiment.lease").exists()
    rc, out = tool(d, "take", "--holder", holder("exp-b", "t2", host="ctl-b"))
    assert rc == 0 and "broken" not in out


def test_stale_lease_broken_with_a_notice(tmp_path: Path):
    d = tmp_path / "node"
    assert tool(d, "take", "--holder", holder("exp-a", "t1"))[0] == 0
    rc, out = tool(d, "take", "--holder", holder("exp-b", "t2"), "--stale-s", "600")
    assert rc == 1 and out["held"]                  # touched just now: alive
    old = time.time() - 700
    os.utime(d / "experiment.lease", (old, old))    # the lease file's mtime is the one sign of life
    rc, out = tool(d, "take", "--holder", holder("exp-b", "t2"), "--stale-s", "600")
    assert rc == 0 and out["holder"]["experiment_id"] == "exp-b"
    assert "exp-a" in out["broken"]["notice"] and "no sign of life" in out["broken"]["reason"]


def test_lease_of_a_dead_controller_on_this_host_is_broken_at_once(tmp_path: Path):
    d = tmp_path / "node"
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                         # a pid that is gone
    assert tool(d, "take", "--holder", holder("exp-a", "t1", pid=p.pid, host=socket.gethostname()))[0] == 0
    rc, out = tool(d, "take", "--holder", holder("exp-b", "t2"))
    assert rc == 0 and f"pid {p.pid}" in out["broken"]["reason"]


def test_driver_leases_all_or_none_and_released_on_exit(tmp_path: Path):
    hosts = [Host(name=n, vars={"ansible_connection": "local", "specab_python": sys.executable,
                                "specab_node_dir": str(tmp_path / n)}) for n in ("h1", "h2")]
    notices: list[str] = []
    # h2 is held by another experiment: taking both fails and leaves h1 free
    assert tool(tmp_path / "h2", "take", "--holder", holder("other", "tx"))[0] == 0
    leases = NodeLeases(hosts, "mine", notice=notices.append)
    try:
        leases.take()
        raise AssertionError("h2's lease was taken although another experiment holds it")
    except LeaseHeld as exc:
        assert "h2" in str(exc) and "other" in str(exc)
    assert not (tmp_path / "h1" / "experiment.lease").exists()
    assert tool(tmp_path / "h2", "release", "--token", "tx")[1]["released"]
    with NodeLeases(hosts, "mine", notice=notices.append, heartbeat_s=0.2) as held:
        rec = json.loads((tmp_path / "h1" / "experiment.lease").read_text())
        assert rec["experiment_id"] == "mine" and rec["controller_pid"] == os.getpid()
        m0 = (tmp_path / "h1" / "experiment.lease").stat().st_mtime
        deadline = time.monotonic() + 20
        while (tmp_path / "h1" / "experiment.lease").stat().st_mtime == m0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "h1" / "experiment.lease").stat().st_mtime > m0, "the lease was not refreshed"
        assert held.taken == hosts
    assert not (tmp_path / "h1" / "experiment.lease").exists() and not (tmp_path / "h2" / "experiment.lease").exists()
    assert notices == []


def test_the_heartbeat_keeps_the_lease_fresh_over_a_run_longer_than_its_stale_age(tmp_path: Path):
    """Over three stale ages the lease file's mtime never lags the clock by a stale age (polled: every gap between two
    of its timestamps is shorter than one), and another experiment is still refused, with the holder's words."""
    host = Host(name="h1", vars={"ansible_connection": "local", "specab_python": sys.executable,
                                 "specab_node_dir": str(tmp_path / "h1")})
    path = tmp_path / "h1" / "experiment.lease"
    stale_s = 1.5
    with NodeLeases([host], "long-run", notice=print, stale_s=stale_s, heartbeat_s=0.3):
        stamps = [path.stat().st_mtime]
        end = stamps[0] + 3 * stale_s
        while stamps[-1] < end:
            m = path.stat().st_mtime
            assert time.time() - m < stale_s, f"no heartbeat for {time.time() - m:.1f} s"
            if m != stamps[-1]:
                stamps.append(m)
            time.sleep(0.05)                        # the poll's period, not what is measured
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        assert len(stamps) >= 6 and max(gaps) < stale_s, gaps
        rc, out = tool(tmp_path / "h1", "take", "--holder", holder("exp-b", "t2"), "--stale-s", str(stale_s))
        assert rc == 1 and out["held"] and "is in use by experiment long-run" in out["error"], out
    assert not path.exists()


def test_a_heartbeat_not_shorter_than_the_stale_age_is_refused_before_any_node_is_touched(tmp_path: Path):
    host = Host(name="h1", vars={"ansible_connection": "local", "specab_python": sys.executable,
                                 "specab_node_dir": str(tmp_path / "h1")})
    try:
        NodeLeases([host], "x", notice=print, stale_s=10, heartbeat_s=10).take()
        raise AssertionError("a heartbeat as long as the stale age was accepted")
    except LeaseError as exc:
        assert "specab_lease_heartbeat_s" in str(exc) and "shorter than its stale age" in str(exc)
    assert not (tmp_path / "h1").exists()


def test_driver_status_names_the_lease_holder_or_says_the_node_is_free(tmp_path: Path):
    import io

    from specab.config.inventory import load_inventory
    from specab.driver.cli import main
    from tests.driver.simnode import SimNode, free_port

    node = SimNode(root=tmp_path, port=free_port())
    inv = node.write_inventory()

    def status(fmt: str = "text") -> str:
        out = io.StringIO()
        assert main(["status", "-i", str(inv), "--format", fmt], out=out) == 0
        return out.getvalue()

    assert "simT: node free (no experiment holds its lease)" in status()
    assert not (node.node_dir / "experiment.lease").exists()
    with NodeLeases(load_inventory(str(inv)).hosts, "exp-status-1", notice=print) as held:
        text = status()
        [row] = json.loads(status("json"))
    h = held.holder
    assert (f"simT: node leased by experiment exp-status-1 (controller {socket.gethostname()} pid {os.getpid()}, "
            f"since {h['started_at_iso']})") in text, text
    assert "stale" not in text
    assert row["lease"]["holder"]["experiment_id"] == "exp-status-1" and row["lease"]["stale"] is None
    assert "simT: node free" in status()
    # a holder whose controller is gone is shown with what the next experiment will do
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert tool(node.node_dir, "take", "--holder",
                holder("exp-dead", "td", pid=gone.pid, host=socket.gethostname()))[0] == 0
    text = status()
    assert "leased by experiment exp-dead" in text and "stale: its controller" in text \
        and "the next experiment breaks it" in text, text
