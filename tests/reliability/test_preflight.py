"""Bad input and security defaults refused or flagged before any server starts."""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specab.driver import preflight
from specab.driver.cli import main
from specab.config.inventory import load_inventory
from specab.config.spec import load_experiment
from specab.config.yamlfile import ConfigError
from specab.driver.options import ExperimentError
from specab.driver.record import check_writable
from specab.config.matrix import build_arms, parse_matrix
from tests.driver.simnode import SimNode, driver, free_port

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def node(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))     # a private engine-flags cache
    n = SimNode(root=tmp_path, port=free_port(), profile="instant")
    yield n
    n.cleanup()


# --------------------------------------------------------------------------- engine flags

def _sglang_like_help() -> str:
    """argparse --help output shaped like SGLang's ServerArgs.add_cli_args (aliases, choices, nargs)."""
    p = argparse.ArgumentParser(prog="launch_server.py")
    p.add_argument("--model-path", "--model", required=True, help="The path of the model weights. See --tp-size.")
    p.add_argument("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    p.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN"])
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--cuda-graph-bs", type=int, nargs="+")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="Whether or not to allow for custom models defined on the Hub in their own modeling "
                        "files. --not-a-flag-mentioned-in-help-text")
    return p.format_help()


def test_item14_help_parser_reads_argparse_declarations_not_help_text():
    flags = preflight.parse_help_flags(_sglang_like_help())
    assert {"--model-path", "--model", "--tensor-parallel-size", "--tp-size", "--speculative-algorithm",
            "--speculative-num-steps", "--cuda-graph-bs", "--trust-remote-code"} <= flags
    assert "--not-a-flag-mentioned-in-help-text" not in flags and "--help" not in flags


class _CountingNode:
    """A node whose engine answers --help with a given text and reports a given package version."""

    def __init__(self, help_text: str, version: str):
        self.help_text, self.version, self.help_calls = help_text, version, 0

    def run(self, argv, timeout=0, env=None):
        if argv[-1] == "--help":
            self.help_calls += 1
            return 0, self.help_text, ""
        return 0, self.version + "\n", ""

    def close(self):
        pass


def test_item14_engine_flags_cached_per_node_and_engine_version(node: SimNode):
    host = load_inventory(node.write_inventory()).hosts[0]
    real_help = subprocess.run(list(host.engine_build(None).cmd) + ["--help"], capture_output=True, text=True,
                               env=dict(os.environ, **host.node_env), timeout=120, check=True).stdout
    fake = _CountingNode(real_help, "0.5.4")
    first = preflight.engine_flags(host, node=fake)
    again = preflight.engine_flags(host, node=fake)
    assert fake.help_calls == 1 and again.flags == first.flags
    assert "--speculative-num-steps" in first.flags and "--mem-fraction-static" in first.flags
    fake.version = "0.5.5"                      # the engine was upgraded: asked again
    upgraded = preflight.engine_flags(host, node=fake)
    assert fake.help_calls == 2 and upgraded.flags == first.flags
    other = load_inventory(node.write_inventory()).hosts[0]
    other = type(other)(name="othernode", vars=other.vars)   # another node with the same engine: its own entry
    preflight.engine_flags(other, node=fake)
    assert fake.help_calls == 3


def test_item14_an_unwritable_flag_cache_still_checks_the_flags(node: SimNode, tmp_path: Path, monkeypatch):
    """A cache directory that cannot be written (a file stands where it should be) costs the next run a `--help`,
    not this run its flag check."""
    host = load_inventory(node.write_inventory()).hosts[0]
    real_help = subprocess.run(list(host.engine_build(None).cmd) + ["--help"], capture_output=True, text=True,
                               env=dict(os.environ, **host.node_env), timeout=120, check=True).stdout
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    fake = _CountingNode(real_help, "0.5.4")
    flags = preflight.engine_flags(host, node=fake)
    assert fake.help_calls == 1 and "--speculative-num-steps" in flags.flags
    assert preflight.unknown_flags(load_experiment_arms(node), flags, None) == []
    preflight.engine_flags(host, node=fake)
    assert fake.help_calls == 2


def load_experiment_arms(node: SimNode) -> list:
    from specab.config.matrix import build_arms
    from specab.config.spec import load_experiment
    return build_arms(load_experiment(node.write_experiment("cache-arms")), []).arms


UNKNOWN_FLAG_ARMS = """\
arms:
  - name: baseline
  - name: eagle3-s2
    server_args:
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 2
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 3
      speculative_turbo_mode: true
"""


def test_item14_unknown_engine_flag_refused_before_launch(node: SimNode):
    """A flag the node's engine does not list is refused (exit 2) before any experiment or server exists."""
    exp = node.write_experiment("uf", arms=UNKNOWN_FLAG_ARMS)
    inv = node.write_inventory()
    proc = driver("-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir),
                  env={"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]})
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, out[-3000:]
    assert "--speculative-turbo-mode is not a flag of the engine on simT" in out and "arm eagle3-s2" in out
    assert "Nothing was started." in out
    assert not node.runs_dir.exists() or not any(node.runs_dir.iterdir())
    assert node.server() is None and node.gpus_busy() == []
    # the flag list came from the simulated node's own --help and is now cached for it
    cached = [json.loads(p.read_text()) for p in preflight.cache_dir().glob("simT-*.json")]
    assert cached and "--speculative-num-steps" in cached[0]["flags"] and cached[0]["version"]


# An SGLang build from before the deterministic mode: the simulated server, its --help without the flag.
OLD_SGLANG = """\
import contextlib, io, runpy, sys
if "--help" not in sys.argv:
    runpy.run_module("specab.sim.launch_server", run_name="__main__", alter_sys=True)
    sys.exit(0)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module("specab.sim.launch_server", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
print("\\n".join(line for line in out.getvalue().splitlines() if "deterministic-inference" not in line))
"""


def test_item14_correctness_on_a_build_without_a_deterministic_mode_is_refused_naming_it(node: SimNode, tmp_path):
    """--correctness on an engine build whose --help lists no --enable-deterministic-inference is refused (exit 2)
    before any experiment or server exists, naming the build (command, flag set, fingerprint): the pass runs after
    the measured blocks, where a launch failure would come hours late."""
    engine = tmp_path / "old_sglang.py"
    engine.write_text(OLD_SGLANG)
    inv = node.write_inventory({**node.host_vars(), "specab_engine_cmd": [sys.executable, str(engine)]})
    exp = node.write_experiment("det")
    proc = driver("-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir), "--correctness",
                  env={"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]})
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, out[-3000:]
    help_text = subprocess.run([sys.executable, str(engine), "--help"], capture_output=True, text=True,
                               timeout=120).stdout
    flags = preflight.parse_help_flags(help_text)
    assert "--speculative-num-steps" in flags and "--enable-deterministic-inference" not in flags
    assert (f"simT: engine build {sys.executable} {engine} (`{sys.executable} {engine}`, SGLang 0.5.23 flags, "
            f"fingerprint {preflight.engines.flags_fingerprint(flags)}) has no deterministic mode: its --help lists "
            f"no --enable-deterministic-inference") in out
    assert "Run without --correctness" in out and "Nothing was started." in out
    assert not node.runs_dir.exists() or not any(node.runs_dir.iterdir())
    assert node.server() is None and node.gpus_busy() == []


# --------------------------------------------------------------------------- bind address

def _plan(exp: Path, inv: Path, *extra: str) -> str:
    buf = io.StringIO()
    assert main(["plan", "-e", str(exp), "-i", str(inv), *extra], out=buf) == 0
    return buf.getvalue()


def test_item17_loopback_by_default_and_one_warning_for_another_address(node: SimNode):
    inv = node.write_inventory()
    exp = node.write_experiment("bind")
    out = _plan(exp, inv)
    assert "not 127.0.0.1" not in out
    # without server_args.host the engine gets no --host: SGLang's (and the simulator's) default 127.0.0.1
    data = load_experiment(exp).raw
    del data["server_args"]["host"]
    exp.write_text(json.dumps({"specab_experiment": data}))
    arms = build_arms(load_experiment(exp), parse_matrix([])).arms
    assert preflight.bind_warnings(arms) == []
    from specab.driver.render import render_arm
    assert "--host" not in render_arm(arms[0], load_inventory(inv).hosts[0], run_id="001-baseline").launch_sh
    # another address: one warning, whatever the number of arms and runs
    data["server_args"]["host"] = "0.0.0.0"
    exp.write_text(json.dumps({"specab_experiment": data}))
    out = _plan(exp, inv, "--matrix", "steps=1,2,3", "--repeats", "3")
    assert out.count("bind the server to 0.0.0.0") == 1, out
    assert "baseline" in out.split("bind the server to 0.0.0.0")[0].splitlines()[-1]


# --------------------------------------------------------------------------- malformed files

@pytest.mark.parametrize("kind", ["experiment", "inventory"])
def test_item15_yaml_error_names_file_line_and_column(tmp_path: Path, kind: str):
    f = tmp_path / f"{kind}.yml"
    if kind == "experiment":
        f.write_text("specab_experiment:\n  name: x\n  model_path: /m\n  arms:\n    - name: baseline\n"
                     "  env: {NCCL_PROTO: LL\n")
        load = load_experiment
    else:
        f.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1: {ansible_host: [10.0.0.1}\n")
        load = load_inventory
    with pytest.raises(ConfigError) as e:
        load(f)
    msg = str(e.value)
    assert str(f) in msg and "YAML error" in msg
    import re
    m = re.search(rf"{re.escape(str(f))}:(\d+):(\d+)", msg)
    assert m, msg
    assert int(m.group(1)) in (5, 6, 7)                  # where the parser stopped (near the unclosed bracket)


@pytest.mark.parametrize("kind", ["experiment", "inventory"])
def test_item15_unknown_keys_named_with_their_line(tmp_path: Path, kind: str):
    f = tmp_path / f"{kind}.yml"
    if kind == "experiment":
        f.write_text("specab_experiment:\n  name: x\n  model_path: /m\n  arms:\n    - name: baseline\n"
                     "  bench:\n    num_request: 3\n")
        with pytest.raises(ConfigError) as e:
            load_experiment(f)
        assert "unknown key 'num_request'" in str(e.value) and "num_requests" in str(e.value)
        assert f"{f}:7" in str(e.value)
    else:
        f.write_text("all:\n  children:\n    gpu_nodes:\n      hostz:\n        n1: {}\n")
        with pytest.raises(ConfigError) as e:
            load_inventory(f)
        assert "unknown key 'hostz'" in str(e.value) and str(f) in str(e.value)


def test_item15_driver_refuses_a_malformed_file_before_touching_the_node(node: SimNode):
    inv = node.write_inventory()
    bad = node.root / "bad.yml"
    bad.write_text("specab_experiment:\n  name: x\n  model_path: /m\n  arms: [\n")
    proc = driver("-e", str(bad), "-i", str(inv), "--runs-dir", str(node.runs_dir))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and f"{bad}:" in out and "Nothing was started." in out, out
    assert not node.node_dir.exists()


@pytest.mark.parametrize("key,value,allowed", [("temperature", "2.5", "[0, 2]"), ("top_p", "0", "(0, 1]")])
def test_item17_sampling_settings_outside_their_range_refused_before_the_node_is_touched(
        node: SimNode, key: str, value: str, allowed: str) -> None:
    """bench.temperature outside [0, 2] or bench.top_p outside (0, 1]: `driver.py run` exits 2 naming the file's
    line, the key, the value and the range, and the node directory is never made (every other bad value the same
    way, checked on the loader the driver and the playbook path both call)."""
    inv = node.write_inventory()
    exp = node.write_experiment("sampling")
    exp.write_text(exp.read_text().replace("  timeout_s: 120", f"  timeout_s: 120\n    {key}: {value}"))
    proc = driver("-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Nothing was started." in out, out
    assert re.search(rf"sampling.yml:\d+:\d+: bench.{key} must be a number in {re.escape(allowed)}, .*; got "
                     rf"{value}", out), out
    assert not node.node_dir.exists()
    for bad in ("-0.1", "2.01", "true", "hot") if key == "temperature" else ("-0.5", "1.01", "false", "all"):
        exp.write_text(re.sub(rf"{key}: .*", f"{key}: {bad}", exp.read_text()))
        with pytest.raises(ConfigError, match=rf"bench.{key} must be a number in {re.escape(allowed)}.*got "):
            load_experiment(exp)


# --------------------------------------------------------------------------- disk full

@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 1 MiB tmpfs, filled up: a real full disk (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        with open(mnt / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_item11_full_disk_refused_before_the_run_starts(node: SimNode, tiny_fs: Path):
    with pytest.raises(ExperimentError, match="not writable|MB free"):
        check_writable(tiny_fs / "runs")
    os.remove(tiny_fs / "filler")                    # writable again, but far below the 50 MB a run needs
    with pytest.raises(ExperimentError, match=r"only \d+ MB free .*--runs-dir"):
        check_writable(tiny_fs / "runs")
    exp = node.write_experiment("df")
    proc = driver("-e", str(exp), "-i", str(node.write_inventory()), "--runs-dir", str(tiny_fs / "runs"))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "MB free" in out and "--runs-dir" in out, out
    assert node.server() is None and not (node.node_dir / "runs").exists()


def test_item11_unwritable_run_directory_refused_before_the_run_starts(node: SimNode):
    ro = node.root / "ro"
    ro.mkdir()
    if os.geteuid() == 0:                     # root ignores modes: make it read-only by a read-only bind mount
        r = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot make a read-only directory as root here")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=False)
    else:
        ro.chmod(0o500)
    try:
        exp = node.write_experiment("ro")
        proc = driver("-e", str(exp), "-i", str(node.write_inventory()), "--runs-dir", str(ro / "runs"))
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "not writable" in out and "--runs-dir" in out, out
        assert node.server() is None and not (node.node_dir / "runs").exists()
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)


def test_item14_an_engine_that_cannot_list_its_flags_is_a_notice_not_a_refusal(node: SimNode):
    """A node whose engine cannot answer --help: the check says so once and leaves the final word to the
    launch (which fails fast on SGLang's 'unrecognized arguments')."""
    hv = node.host_vars()
    hv["specab_engine_cmd"] = [str(node.root / "no-such-engine")]
    host = load_inventory(node.write_inventory(hv)).hosts[0]
    arms = build_arms(load_experiment(node.write_experiment("nh")), parse_matrix([])).arms
    notices: list[str] = []
    assert preflight.check_engine_flags(arms, [host], notice=notices.append) == []
    assert len(notices) == 1 and "no-such-engine" in notices[0] and "when it starts" in notices[0], notices


# --------------------------------------------------------------------------- ports

def test_item20_port_taken_on_the_node_is_refused_in_preflight_naming_the_holder(node: SimNode, capsys):
    """A port another process holds would fail every run at its start: refused before the first run."""
    import socket
    exp = node.write_experiment("port")
    inv = node.write_inventory()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", node.port))
        s.listen()
        code = main(["-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir)], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"simT: port {node.port} is already taken (LISTEN) by PID {os.getpid()}" in err, err
    assert "Every run would fail at its start." in err and "Nothing was started." in err
    assert not node.runs_dir.exists() or not any(node.runs_dir.iterdir())
    assert node.server() is None


def test_item20_port_held_by_our_recorded_server_is_not_refused(tmp_path: Path):
    """The run's stop step frees a port our own (recorded) server holds: only foreign holders are refused."""
    import sys
    from specab.config.inventory import Host
    port = free_port()
    listener = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                                 "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
                                 "print('up', flush=True); time.sleep(120)", str(port)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert listener.stdout.readline().strip() == "up"
        node_dir = tmp_path / "node"
        node_dir.mkdir()
        host = Host(name="n", vars={"ansible_connection": "local", "specab_python": sys.executable,
                                    "specab_node_dir": str(node_dir)})
        refused = preflight.ports_refused(host, [("127.0.0.1", port)])
        assert len(refused) == 1 and f"by PID {listener.pid}" in refused[0], refused
        (node_dir / "server.json").write_text(json.dumps({"pid": listener.pid, "pgid": listener.pid,
                                                          "sid": listener.pid, "port": port}))
        assert preflight.ports_refused(host, [("127.0.0.1", port)]) == []
    finally:
        listener.kill()
        listener.wait()
