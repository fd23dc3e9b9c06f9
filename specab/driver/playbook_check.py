"""The playbook path's preflight: `playbooks/ab_test.yml` checks an experiment exactly as the driver does.

    <python> -m specab.driver.playbook_check < request.json

The request (JSON on stdin, written by ab_test.yml's Preflight play on the controller):
``{"experiment_file": PATH or null, "hosts": {NAME: {host vars}}}``, the host variables being the
connection and `specab_*` variables Ansible resolved for each host of `gpu_nodes`.

One implementation: the experiment file is loaded and validated by
`specab.config.spec.load_experiment` (unknown keys with "did you mean", types, file:line:col), its arms
by `specab.config.matrix.build_arms`, and the nodes are asked by `specab.driver.preflight` (engine flags
from the node's own `--help`, ports already taken). A relative experiment path is resolved from the
current directory (where ansible-playbook was started), not from `playbooks/`.

On success: exit 0 and, on stdout, ``{"experiment_file": absolute path, "specab_experiment": the mapping,
"arms": [...], "baselines": {...}, "notices": [...]}``: `arms` are the file's arms in file order, each resolved
by `specab.config.spec.resolve_arm` as the driver resolves them (what every per-arm role receives as
`specab_arm`), and `baselines` maps each arm to the arm it is compared with (the file's first arm that does
not speculate; a baseline arm names itself). On bad input: exit 2, the reason on stderr, nothing touched.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from specab.config.inventory import Host
from specab.config.matrix import MatrixError, build_arms, parse_matrix
from specab.config.spec import DEFAULT_EXPERIMENT, ArmSpec, ExperimentSpec, load_experiment, resolve_arm
from specab.config.yamlfile import ConfigError
from specab.driver import nodecheck, preflight
from specab.driver.options import EXIT_USAGE, check_arms

# the host variables the checks read (connection, engine, node directory); nothing else crosses over
HOST_KEYS = ("ansible_connection", "ansible_host", "ansible_port", "ansible_ssh_port", "ansible_user",
             "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_private_key_file",
             "ansible_ssh_common_args", "ansible_ssh_extra_args", "specab_engine_cmd", "specab_python",
             "specab_node_dir", "specab_node_env", "specab_multinode", "specab_smi_cmd")


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def experiment_path(given: str | None, cwd: Path) -> Path:
    """The experiment file: the default one when none is given, a relative path from `cwd`."""
    if not given:
        return DEFAULT_EXPERIMENT
    p = Path(os.path.expanduser(given))
    return p if p.is_absolute() else cwd / p


def round_arms(exp: ExperimentSpec) -> list[ArmSpec]:
    """The file's arms in file order, resolved; the speculative ones compared with the first that is not."""
    first = [resolve_arm(exp, arm) for arm in exp.arms]
    baseline = next((a.name for a in first if a.is_baseline), first[0].name)
    return [resolve_arm(exp, arm, baseline=baseline) for arm in exp.arms]


def check(request: dict[str, Any], cwd: Path, notices: list[str]) -> dict[str, Any]:
    """Validate the experiment and ask the nodes; raises ConfigError (or MatrixError) on bad input."""
    given = request.get("experiment_file")
    path = experiment_path(str(given) if given else None, cwd)
    if not path.is_file():
        raise ConfigError(f"specab_experiment_file={given}: {path} does not exist (a relative path is read from "
                          f"the directory ansible-playbook runs in, {cwd}). Pass an existing experiment file, "
                          f"e.g. -e specab_experiment_file=experiments/default.yml from the repository root.")
    exp = load_experiment(path)
    hosts = [Host(name=str(name), vars={k: v for k, v in (hv or {}).items() if k in HOST_KEYS})
             for name, hv in (request.get("hosts") or {}).items()]
    arms = build_arms(exp, parse_matrix([], exp.engine)).arms
    notices += exp.warnings + check_arms(exp, arms) + preflight.bind_warnings(arms)
    multinode = any(_truthy(h.vars.get("specab_multinode")) for h in hosts)
    # the GPUs, the model's context and the node directory's room, as the driver checks them
    nodecheck.check_nodes(exp, arms, hosts, multinode, notices.append)
    flags = preflight.check_engine_flags(arms, hosts, notice=notices.append, expected_kind=exp.engine)
    preflight.check_ports(arms, hosts[:1] if multinode else hosts, notice=notices.append)
    # in the node engine's spelling, as the driver launches them (cuda_graph_max_bs is --cuda-graph-max-bs-decode
    # on SGLang 0.5.23, which no longer registers --cuda-graph-max-bs)
    resolved = preflight.spell_arms(round_arms(exp), flags)
    return {"experiment_file": str(path.resolve()), "specab_experiment": exp.as_extravar(),
            "arms": [a.to_extravar() for a in resolved], "baselines": {a.name: a.baseline for a in resolved},
            "notices": notices}


def main(stdin: TextIO | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    try:
        request = json.loads(stdin.read() or "{}")
        if not isinstance(request, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        print(f"playbook_check: the request on stdin is not valid JSON ({exc})", file=stderr)
        return EXIT_USAGE
    notices: list[str] = []
    try:
        result = check(request, Path.cwd(), notices)
    except (ConfigError, MatrixError) as exc:
        print(f"{exc}\nNothing was started.", file=stderr)
        return EXIT_USAGE
    json.dump(result, stdout)
    stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
