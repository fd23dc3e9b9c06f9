#!/usr/bin/python
# One node tool run with its typed spec (the one shape of every per-run role's node step). It runs on the node under
# Ansible's interpreter and imports nothing of specab: the tool runs under the given python, with the task's
# environment, and builds from the JSON the same spec dataclass the run queue (specab/node/runsteps.py) builds.
from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: specab_node
short_description: Run one specab node tool with its typed spec and return its structured result
description:
  - Runs C(<node_dir>/bin/specab/node TOOL --spec-json -) with the spec as one JSON object on stdin; the tool
    builds its spec dataclass from it (the keys are the dataclass's field names, an unknown or missing key is
    refused) and prints one JSON object, which becomes the task's result.
  - A non-zero exit fails the task with the headline of a failure in O(phase) (the vocabulary's words,
    C(specab/vocab/phases.py), for O(host)), a colon and the tool's own C(error); the result also holds C(phase),
    C(headline), C(task) (what the run was doing) and C(error) apart, as the run queue's C(done.json) does. A call
    outside a run's phases (the node lease, the run queue's commands) fails with O(fail_msg) instead; O(fail_hint)
    follows the error in either.
  - The tool's JSON keys are the task's result (C(ok), C(error), ... besides C(rc), C(start), C(end)).
  - The values of the spec's secret-named keys (the secret rule of C(specab/vocab/contract.py)) are masked in the
    result and in the invocation.
  - In check mode nothing runs; the task is reported skipped.
options:
  tool:
    description:
      - The node tool, a module of the node package that runs as a tool (C(tools) in C(specab/node/__main__.py): its
        files are the one list of them); the package refuses any other name, exit status 2.
    type: str
    required: true
  spec:
    description:
      - The tool's spec (the fields of its dataclass, e.g. C(StopSpec) in C(specab/node/stop.py)).
      - C(lease) and C(sequence) take a C(command) key too (C(LeaseSpec); C(sequence.SPECS) names the dataclass of
        each of its commands).
    type: dict
    required: true
  node_dir:
    description: The node directory; the tools live in C(<node_dir>/bin/specab/).
    type: str
    required: true
  python:
    description: The Python that runs the tool.
    type: str
    default: python3
  phase:
    description:
      - The run's phase this step is (a node phase of C(specab/vocab/phases.py), e.g. C(loading)); with O(host).
      - A call outside a run's phases (the node lease, the run queue's commands) gives O(fail_msg) instead.
    type: str
  host:
    description: The host as the inventory names it (the headline's words name it); with O(phase).
    type: str
  arm:
    description: The arm's name, where the phase's words name it.
    type: str
    default: ""
  fail_msg:
    description: Without O(phase), the headline of a failure, before the tool's error.
    type: str
  fail_hint:
    description: Words after the tool's error in a failure (what was not done, what to do).
    type: str
    default: ""
  program:
    description:
      - The tool as a C(python -c) program that carries it (the lookup C(specab_node_program)), for a tool run
        before node_prepare ships anything (the node lease); C(node_dir) then needs no C(bin/).
      - Without the shipped vocabulary the module masks no spec value itself (the stdout callback
        C(specab_redact) still redacts every secret-named value of the result).
    type: str
author: specab
"""

# What a successful run changed on the node: a stop (or a teardown's) changed something only when a server was
# running; a start always starts one, a bench writes its run's measurements, a rank's sampler changed something when it
# was started or stopped; a lease taken anew, put on hold or released, a manifest written, a sequencer started, a queue
# reset, staged or finished; an instance's server taken over, its cache reset or kept; the other tools and commands
# only observe.
CHANGED = {
    "stop": lambda spec, out: bool(out.get("was_running")),
    "teardown": lambda spec, out: bool((out.get("stop") or {}).get("was_running")),
    "start": lambda spec, out: True,
    "bench": lambda spec, out: True,
    "ranksampler": lambda spec, out: bool(out.get("started") or out.get("stopped")),
    "lease": lambda spec, out: spec.get("command") in ("take", "hold", "release") and not out.get("already")
    and out.get("released") is not False,
    "manifest": lambda spec, out: True,
    "instance": lambda spec, out: spec.get("action") in ("take", "reset", "keep"),
    "sequence": lambda spec, out: spec.get("command") in ("reset", "stage", "finish")
    or out.get("ensured") == "started",
}


def tool_argv(python: str, node_dir: str, tool: str, program: Optional[str] = None) -> List[str]:
    if program:
        return [python, "-c", program, "--spec-json", "-"]
    return [python, os.path.join(node_dir, "bin", "specab", "node"), tool, "--spec-json", "-"]


def secret_values(node_dir: str, spec: Dict[str, Any]) -> List[str]:
    """The values of the spec's secret-named keys, by the one secret rule (specab/vocab/contract.py, shipped by
    node_prepare beside the tools): Ansible masks them in the task's result and its invocation."""
    sys.path.insert(0, os.path.join(node_dir, "bin"))
    from specab.vocab import contract  # pylint: disable=import-outside-toplevel
    return contract.scrub_values(contract.nested_secret_values(spec))


def failure_words(phase: str, host: str, arm: str) -> Dict[str, str]:
    """The failure's headline and task, in the vocabulary's words (specab/vocab/phases.py, shipped beside the
    tools; imported after secret_values put it on the path)."""
    from specab.vocab import phases  # pylint: disable=import-outside-toplevel
    return {"phase": phase, "headline": phases.failure_headline(phase, host, arm),
            "task": phases.failure_task(phase, arm)}


def parse_output(stdout: str) -> Dict[str, Any]:
    """The tool's one JSON object (its last stdout line), or {} when it printed none (a crash before emit)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return {}
    try:
        out = json.loads(lines[-1])
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            tool=dict(type="str", required=True),
            spec=dict(type="dict", required=True),
            node_dir=dict(type="str", required=True),
            python=dict(type="str", default="python3"),
            phase=dict(type="str", default=None),
            host=dict(type="str", default=None),
            arm=dict(type="str", default=""),
            fail_msg=dict(type="str", default=None),
            fail_hint=dict(type="str", default=""),
            program=dict(type="str", default=None, no_log=True),
        ),
        supports_check_mode=True,
        required_one_of=[("phase", "fail_msg")],
        mutually_exclusive=[("phase", "fail_msg")],
        required_by={"phase": ("host",)},
    )
    p = module.params
    try:
        if not p["program"]:
            module.no_log_values.update(secret_values(p["node_dir"], p["spec"]))
    except ImportError as exc:
        module.fail_json(msg="the node tools are not in %s/bin (the node_prepare role ships them): %s"
                         % (p["node_dir"], exc))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: %s not run" % p["tool"])
    argv = tool_argv(p["python"], p["node_dir"], p["tool"], p["program"])
    start = datetime.datetime.now()
    rc, stdout, stderr = module.run_command(argv, data=json.dumps(p["spec"]), binary_data=True,
                                            expand_user_and_vars=False)
    out = parse_output(stdout)
    # the tool's keys are the task's; Ansible's own result keys are the module's to set
    mine = {k: v for k, v in out.items() if k not in ("msg", "rc", "changed", "failed", "skipped", "start", "end")}
    # when the tool ran, as ansible.builtin.command reports it (scripts/gpu_validation.py times the tools by it)
    mine.update(start=str(start), end=str(datetime.datetime.now()))
    if rc != 0 or not out:
        error = out.get("error") or "%s exited with %d: %s" % (p["tool"], rc, stderr.strip())
        if p["phase"]:
            words = failure_words(p["phase"], p["host"], p["arm"])
            fail = dict(msg="%s: %s" % (words["headline"], error), **words)
        else:
            fail = dict(msg="%s: %s" % (p["fail_msg"], error))
        if p["fail_hint"]:
            fail["msg"] += " " + p["fail_hint"]
        module.fail_json(**dict(mine, rc=rc, error=error, **fail))
    module.exit_json(**dict(mine, changed=CHANGED.get(p["tool"], lambda spec, o: False)(p["spec"], out), rc=rc))

if __name__ == "__main__":
    main()
