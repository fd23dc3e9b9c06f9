"""Ansible's default output with every secret value redacted: the stdout callback of the repository's playbooks.

A secret reaches ansible-playbook's output through task results (``-v`` prints them: the experiment as the
preflight read it, a module's arguments, a rendered file's content), through ``--diff`` (the rendered
``launch.sh`` holds ``--api-key <value>``, ``nccl.env`` holds ``HF_TOKEN=<value>``) and through warnings and
errors. This callback learns the secret values before anything is printed, and every line the process prints goes
through one redaction:

* the values it knows: the secret-named variables of the controller's environment, of the inventory's host and
  group variables and of the extra vars (read when a play starts), and every secret-named key of each task result
  (read before the default callback formats that result; a JSON string in a result is read too);
* ``SECRET_NAME=value`` assignments and ``--secret-flag value`` pairs whose value it never saw.

Which names are secret is THE secret rule of ``specab/vocab/contract.py`` (``is_secret_name``), loaded from this
checkout by path: the plugin runs inside ansible-playbook, whose Python may have another specab installed or none.
The redaction is installed on Ansible's one ``Display`` object, so warnings, errors and what the worker processes
send to it are redacted as well as the callback's own lines.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ansible.plugins.callback.default import CallbackModule as DefaultCallbackModule

DOCUMENTATION = """
name: specab_redact
type: stdout
short_description: Ansible's default output with every secret value redacted
description:
  - The default stdout callback, each printed line redacted with specab's secret rule
    (specab/vocab/contract.py is_secret_name); values are learned from the controller's environment, the
    inventory, the extra vars and every task result before it is printed.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout_callback in ansible.cfg
"""

CONTRACT = Path(__file__).resolve().parents[2] / "specab" / "vocab" / "contract.py"
# The name roles/collect/action_plugins/collect_scrub.py loads it under too: one module object per process.
CONTRACT_MODULE = "specab_redact_contract"


def load_contract() -> ModuleType:
    """specab/vocab/contract.py of this checkout (stdlib only), imported once under a private name.

    The repository's other controller-side plugins (the lookups, the launch filter) import specab from the Python
    that runs ansible-playbook, as set up by the driver and the Makefile. The two plugins that apply the secret rule
    do not: the redaction must hold whatever Python runs Ansible, with specab installed or not (a playbook then still
    prints redacted output up to the task that fails), and must never take another installed specab's rule. So this
    callback and collect_scrub.py each load the checkout's file by path, with the same eight lines (each plugin is
    loaded by file path from its own directory, so neither can import the other's), under CONTRACT_MODULE: whichever
    runs first, the other gets that module; tests/ansible/test_plugin_contract.py holds them to it."""
    mod = sys.modules.get(CONTRACT_MODULE)
    if mod is None:
        spec = importlib.util.spec_from_file_location(CONTRACT_MODULE, CONTRACT)
        if spec is None or spec.loader is None:
            raise ImportError(f"specab_redact: cannot load the secret rule from {CONTRACT}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[CONTRACT_MODULE] = mod
        try:
            spec.loader.exec_module(mod)
        except (OSError, SyntaxError, ImportError) as exc:    # no half-loaded rule is left for the next call
            del sys.modules[CONTRACT_MODULE]
            raise ImportError(f"specab_redact: cannot load the secret rule from {CONTRACT} ({exc}); the plugin runs "
                        f"from a specab checkout and needs its specab/vocab/contract.py") from exc
    return mod


class Redactor:
    """The secret values seen so far and the one function that redacts a text with them."""

    def __init__(self, contract: ModuleType) -> None:
        self.contract = contract
        self.known: set[str] = set()
        self.values: list[str] = []

    def learn(self, value: Any) -> None:
        found = set(self.contract.nested_secret_values(value)) - self.known
        if found:
            self.known |= found
            self.values = self.contract.scrub_values(self.known)

    def learn_env(self, env: dict[str, str]) -> None:
        self.learn({k: v for k, v in env.items() if self.contract.is_secret_name(k)})

    def redact(self, text: str) -> str:
        return self.contract.scrub_text(text, self.values)


def redacting(display: Callable[..., None], redactor: Redactor) -> Callable[..., None]:
    """``Display.display`` with its message redacted first (every other Display method prints through it)."""

    def wrapper(msg: str, *args: Any, **kwargs: Any) -> None:
        return display(redactor.redact(msg) if isinstance(msg, str) else msg, *args, **kwargs)

    wrapper.specab_redactor = redactor  # type: ignore[attr-defined]
    return wrapper


class CallbackModule(DefaultCallbackModule):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "specab_redact"

    def __init__(self) -> None:
        super().__init__()
        self._redactor = Redactor(load_contract())
        self._redactor.learn_env(dict(os.environ))
        current = self._display.display
        existing = getattr(current, "specab_redactor", None)
        if existing is not None:        # already installed (a second instance in one process): share its values
            self._redactor = existing
        else:
            self._display.display = redacting(current, self._redactor)  # type: ignore[method-assign]

    # ------------------------------------------------------------------ learning values before they are printed
    def v2_playbook_on_play_start(self, play: Any) -> None:
        vm = play.get_variable_manager()
        if vm is not None:
            self._redactor.learn(dict(vm.extra_vars))
            inventory = getattr(vm, "_inventory", None)
            if inventory is not None:
                for host in inventory.get_hosts():
                    self._redactor.learn(dict(host.get_vars()))
                    for group in host.get_groups():
                        self._redactor.learn(dict(group.get_vars()))
        super().v2_playbook_on_play_start(play)


def _learning(name: str) -> Callable[..., None]:
    """The default callback's method ``name``, the task result's secret values learnt before it prints them."""
    def method(self: CallbackModule, result: Any, *args: Any, **kwargs: Any) -> None:
        self._redactor.learn(result.result)
        getattr(super(CallbackModule, self), name)(result, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    return method


for _name in ("v2_runner_on_ok", "v2_runner_on_failed", "v2_runner_on_skipped", "v2_runner_on_unreachable",
              "v2_runner_item_on_ok", "v2_runner_item_on_failed", "v2_runner_item_on_skipped", "v2_runner_retry",
              "v2_on_file_diff", "v2_runner_on_async_ok", "v2_runner_on_async_failed"):
    setattr(CallbackModule, _name, _learning(_name))
