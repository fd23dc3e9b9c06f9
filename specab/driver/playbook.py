"""ansible-runner wrapper: one playbook run with a unique ident, events mapped to phases (the role that each
task belongs to, in the event data: specab.vocab.phases).

Pitfalls handled (the ansible-runner, testinfra and fabric reference §0-§1):
- ansible-playbook is found through the child's PATH: the venv's bin dir is put first;
- `suppress_env_files=True`: extravars are passed inline, nothing written to `env/`;
- one unique ident per run (a reused ident mixes job events);
- `artifacts/<ident>/command` stores the child's full environment: secret-named variables are
  removed from the child environment before it starts, and after the run every artifact file
  is scrubbed of known secret values; what `-v` streams and what a failure quotes are scrubbed as
  each event arrives (the secret rule: specab.vocab.contract);
- the cancel callback is polled every `pexpect_timeout` seconds (0.25 s here, not the default 5 s).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
from ansible_runner.interface import init_runner

import specab
from specab.vocab.contract import (PRIVATE_RUN_FILES, is_secret_name, learnable, named_secret_values,
                                   nested_secret_values, scrub_bytes, scrub_text, scrub_values)
from specab.vocab.phases import display_phase, phase_of_event


# told each phase as it begins: its display name, and when it began where that was before the event that tells it (a
# node tool's phases, from its result); None: now
OnPhase = Callable[[str, "float | None"], None]


class RunnerSetupError(Exception):
    """ansible-runner could not be set up (bad paths, missing ansible-playbook)."""


@dataclass
class Failure:
    phase: str | None
    task: str
    host: str | None
    message: str
    time: float = field(default_factory=time.time)
    # a node tool's failure (module specab_node): its message is "<headline>: <error>", the headline the
    # vocabulary's (specab.vocab.phases), as the run queue's done.json states it
    headline: str | None = None

    @property
    def reason(self) -> str:
        """The failure as a run records it: a node tool's headline and error, another task's name and message."""
        return self.message if self.headline else f"{self.task}: {self.message}"


@dataclass
class PlaybookResult:
    status: str                         # successful | failed | canceled | timeout | error
    rc: int | None
    ident: str
    artifact_dir: Path
    failures: list[Failure] = field(default_factory=list)
    stdout_tail: str = ""
    hosts: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0 and not self.failures


def failure_message(res: dict[str, Any]) -> str:
    """The most useful message of a failed task result (node tools put theirs in JSON `error`)."""
    for key in ("stdout", "module_stdout"):
        text = res.get(key)
        if isinstance(text, str) and text.strip().startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(text)
                if isinstance(data, dict) and data.get("error"):
                    return str(data["error"])
    msg = res.get("msg")
    if isinstance(msg, str) and msg and msg != "non-zero return code":
        return msg
    parts = [str(res.get(k)).strip() for k in ("stderr", "stdout") if res.get(k)]
    if parts:
        return "\n".join(p for p in parts if p)[-2000:]
    if isinstance(msg, str) and msg:
        return msg
    results = res.get("results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict) and item.get("failed"):
                return failure_message(item)
    return json.dumps({k: v for k, v in res.items() if not k.startswith("_")})[:2000]


# The run files that hold secrets by design and name them (launch.sh, nccl.env, args.json, queue_entry.json): not
# the engine's log, whose every `*_token=` line would count
SECRET_CARRIERS = frozenset(PRIVATE_RUN_FILES) - {"server.log"}


def scrub_tree(root: Path, secrets: list[str]) -> int:
    """Replace every occurrence of a secret value in the files under `root`; returns files changed. The values are
    `secrets` and those the run files that carry secrets by design name themselves (`named_secret_values` of
    SECRET_CARRIERS and *.env): a node env value only Ansible rendered (a file lookup, a vault) is known to the
    driver only as its template, but the queue entry and launch.sh hold it under its secret name. A file that held
    one loses its group and other permissions (on the node it was private: launch.sh, nccl.env, args.json,
    server.log), as the collect role's scrub does (roles/collect/action_plugins/collect_scrub.py)."""
    if not root.exists():
        return 0
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    named: list[str] = []
    for path in files:
        if path.name not in SECRET_CARRIERS and not path.name.endswith(".env"):
            continue
        try:
            named += named_secret_values(path.read_bytes().decode("utf-8", errors="replace"))
        except OSError:
            continue
    values = scrub_values(list(secrets) + named)
    if not values:
        return 0
    changed = 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        new = scrub_bytes(data, values)
        if new != data:
            path.write_bytes(new)
            path.chmod(path.stat().st_mode & 0o700)
            changed += 1
    return changed


def runner_ident(what: str) -> str:
    """An ansible-runner ident (its artifact directory's name): what runs, when, and this process."""
    return f"{what}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{int(time.time() * 1000) % 100000}"


class _Events:
    """What one playbook run's events say as they arrive: its phase, failures, hosts, `specab_*` facts and last
    printed lines, every secret the run may print scrubbed from them."""

    def __init__(self, extravars: dict[str, Any], secrets: list[str] | None, on_phase: OnPhase | None,
                 stream: Callable[[str], None] | None) -> None:
        self.failures: list[Failure] = []
        self.stdout_lines: list[str] = []
        self.hosts: list[str] = []
        self.facts: dict[str, Any] = {}
        self.phase: str | None = None
        self.seen: set[str] = set()
        self.task_started = time.time()
        self.on_phase, self.stream = on_phase, stream
        # every secret the run may print: the experiment's, those of the driver's own environment (the child
        # does not get them, but a node reached over a local connection may have them from elsewhere), any
        # secret-named key of the extra vars at any depth, and, as the run goes, those of each task result. The
        # stdout callback formats the events but is not relied on: ansible-runner prints through its own, which
        # wraps Ansible's default callback or whichever ANSIBLE_STDOUT_CALLBACK names, not the redacting one.
        self.known = set(scrub_values(list(secrets or []) + [v for k, v in os.environ.items()
                                                             if is_secret_name(k) and v]
                                      + nested_secret_values(extravars)))
        self.secret_values = scrub_values(self.known)

    def set_phase(self, phase: str, at: float | None = None) -> None:
        if phase == "stopping" and "stopping" in self.seen and self.phase != "stopping":
            phase = "final stop"            # the run's second stop (its every task: one phase)
        if phase == self.phase:
            return
        self.phase = phase
        self.seen.add(phase)
        if self.on_phase:
            self.on_phase(phase, at)

    def learn(self, value: Any) -> None:
        """A secret-named key's value in `value` (a task result: a node env read on the node, a rendered value
        that the controller saw only as a template) is scrubbed from this event on."""
        found = set(scrub_values(learnable(nested_secret_values(value)))) - self.known
        if found:
            self.known.update(found)
            self.secret_values = scrub_values(self.known)

    def replay(self, phases: Any) -> None:
        """The phases a node tool went through in one task (the teardown's `phases`: node phase, seconds from the
        tool's start), each from the task's start on."""
        for p in phases if isinstance(phases, list) else []:
            display = display_phase(p.get("phase")) if isinstance(p, dict) else None
            if display:
                self.set_phase(display, self.task_started + float(p.get("t_rel_s") or 0))

    def fail(self, phase: str | None, task: str, host: str | None, message: str, headline: str | None = None) -> None:
        self.failures.append(Failure(phase=phase, task=task, host=host, headline=headline,
                                     message=scrub_text(message, self.secret_values)))

    def on_event(self, ev: dict[str, Any]) -> bool:
        kind = ev.get("event", "")
        data = ev.get("event_data") or {}
        self.learn(data.get("res"))
        # what -v streams and what a failure quotes never hold a secret (the artifacts are scrubbed after the run)
        text = scrub_text(ev.get("stdout") or "", self.secret_values)
        if text:
            self.stdout_lines.extend(text.splitlines())
            del self.stdout_lines[:-200]
            if self.stream:
                self.stream(text)
        res = data.get("res") or {}
        if kind == "playbook_on_task_start":
            self.task_started = time.time()
            phase = phase_of_event(data)
            if phase:
                self.set_phase(phase)
        elif kind in ("runner_on_failed", "runner_item_on_failed") and not data.get("ignore_errors"):
            headline = res.get("headline") if isinstance(res.get("headline"), str) else None
            self.fail(phase_of_event(data) or self.phase, str(data.get("task") or ""), data.get("host"),
                      failure_message(res), headline)
        elif kind == "runner_on_unreachable":
            self.fail(self.phase, str(data.get("task") or ""), data.get("host"),
                      "host unreachable: " + str(res.get("msg", "")).strip())
        elif kind == "runner_on_ok":
            host = data.get("host")
            if host and host not in self.hosts:
                self.hosts.append(host)
            af = res.get("ansible_facts") if isinstance(res, dict) else None
            if isinstance(af, dict):
                for k, v in af.items():
                    if k.startswith("specab_"):
                        self.facts.setdefault(host or "", {})[k] = v
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(res, dict):
            self.replay(res.get("phases"))
        return True


class PlaybookRunner:
    """Runs playbooks of the repository through ansible-runner."""

    def __init__(self, project_dir: Path, inventory: Path, private_root: Path, verbose: bool = False,
                 stream: Callable[[str], None] | None = None):
        self.project_dir = project_dir
        self.inventory = inventory
        self.private_root = private_root
        self.verbose = verbose
        self.stream = stream or (lambda line: print(line, file=sys.stderr))

    def child_env(self) -> dict[str, str]:
        """Extra environment: venv bin dir first on PATH; the specab package the driver runs first on PYTHONPATH,
        since the roles' and playbooks' Python plugins import it (a controller that runs the driver from a checkout
        without installing it, as the device scripts do, has it on sys.path only through driver.py's folder); the
        repository's callback plugins named here too, since ansible-runner sets ANSIBLE_CALLBACK_PLUGINS (to add its
        own), which hides ansible.cfg's callback_plugins."""
        venv_bin = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "")
        package_root = str(Path(specab.__file__).resolve().parent.parent)
        pythonpath = os.environ.get("PYTHONPATH", "")
        return {"PATH": f"{venv_bin}{os.pathsep}{path}" if path else venv_bin,
                "PYTHONPATH": f"{package_root}{os.pathsep}{pythonpath}" if pythonpath else package_root,
                "ANSIBLE_CONFIG": str(self.project_dir / "ansible.cfg"),
                "ANSIBLE_CALLBACK_PLUGINS": str(self.project_dir / "plugins" / "callback"),
                "ANSIBLE_NOCOLOR": "1",
                "PYTHONUNBUFFERED": "1"}

    def run(self, playbook: str, extravars: dict[str, Any], ident: str, *,
            cancel: threading.Event | None = None, on_phase: OnPhase | None = None,
            secrets: list[str] | None = None, timeout: int | None = None,
            limit: str | None = None) -> PlaybookResult:
        """Run `playbook` once; blocks until it ends or `cancel` is set."""
        self.private_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        events = _Events(extravars, secrets, on_phase, self.stream if self.verbose else None)
        kwargs: dict[str, Any] = dict(
            private_data_dir=str(self.private_root), project_dir=str(self.project_dir), playbook=playbook,
            inventory=str(self.inventory), extravars=extravars, envvars=self.child_env(), ident=ident,
            quiet=True, suppress_env_files=True, event_handler=events.on_event,
            cancel_callback=(lambda: bool(cancel and cancel.is_set())),
            settings={"pexpect_timeout": 0.25, "suppress_ansible_output": True},
        )
        if timeout:
            kwargs["timeout"] = timeout
        if limit:
            kwargs["limit"] = limit
        try:
            runner = init_runner(**kwargs)
        except Exception as exc:   # ansible-runner raises ConfigurationError and friends
            raise RunnerSetupError(f"ansible-runner could not start {playbook}: {exc}") from exc
        # the child environment: no secret-named variables (they would land in artifacts/<ident>/command)
        runner.config.env = {k: v for k, v in runner.config.env.items() if not is_secret_name(k)}
        try:
            runner.run()
        finally:
            scrub_tree(Path(runner.config.artifact_dir), events.secret_values)
        status, failures = runner.status, events.failures
        if runner.rc == 127 and not failures:
            failures.append(Failure(phase=None, task="ansible-playbook", host=None,
                                    message="ansible-playbook not found on PATH (rc 127): install ansible-core "
                                            "in the Python environment that runs the driver."))
        if status == "failed" and not failures:
            failures.append(Failure(phase=events.phase, task="ansible-playbook", host=None,
                                    message="\n".join(events.stdout_lines[-15:]) or f"rc {runner.rc}"))
        if status == "timeout":
            failures.append(Failure(phase=events.phase, task="ansible-playbook", host=None,
                                    message=f"the playbook ran past its timeout of {timeout} s"))
        return PlaybookResult(status=status, rc=runner.rc, ident=ident, artifact_dir=Path(runner.config.artifact_dir),
                              failures=failures, stdout_tail="\n".join(events.stdout_lines[-40:]),
                              hosts=events.hosts, facts=events.facts)


__all__ = ["PlaybookRunner", "PlaybookResult", "Failure", "phase_of_event", "scrub_tree", "ansible_runner"]
