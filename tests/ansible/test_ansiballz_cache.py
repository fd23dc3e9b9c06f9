"""plugins/callback/ansiballz_cache.py: ansible-core's module payloads are built once per machine, not per playbook.

What a user relies on: a playbook run after the first does not rebuild ansible-core's modules nor the repository's
specab_node and still works, through plain ``ansible-playbook`` (ansible.cfg) and through the driver's ansible-runner
(which sets ANSIBLE_CALLBACK_PLUGINS itself); a module of a role or collection is never kept (it can change without
ansible-core changing); an edited module of the repository is built anew (the cache's key holds its bytes); a
half-written or locked file is never copied; a kept payload is never overwritten; a kept payload carries the
bytecode of its Python files, so a module run does not compile ansible's module_utils again.
"""
from __future__ import annotations

import base64
import importlib.util
import io
import json
import marshal
import os
import pickle
import subprocess
import zipfile
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specab.driver.playbook import PlaybookRunner
from tests.ansible.conftest import REPO, VENV_BIN

PLUGIN = REPO / "plugins" / "callback" / "ansiballz_cache.py"
CREATING = "ANSIBALLZ: Creating module"

PLAYBOOK = """\
- name: Two of ansible-core's modules on this machine
  hosts: all
  gather_facts: false
  tasks:
    - name: Stat a directory
      ansible.builtin.stat:
        path: {path}
    - name: Run a command
      ansible.builtin.command: "true"
      changed_when: false
    - name: The repository's own module (check mode runs its payload, which returns at once)
      specab_node:
        tool: gpufree
        node_dir: {path}
        fail_msg: unused in check mode
        spec: {{}}
      check_mode: true
"""


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("specab_ansiballz_cache", PLUGIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _local(tmp_path: Path) -> tuple[Path, Path]:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    playbook = tmp_path / "two_modules.yml"
    playbook.write_text(PLAYBOOK.format(path=tmp_path))
    return inventory, playbook


def _kept(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("specab/ansiballz/*/*") if not p.name.startswith("."))


def test_copy_new_keeps_only_finished_ansible_core_payloads_and_never_overwrites(tmp_path: Path) -> None:
    plugin = _plugin()
    src, dst = tmp_path / "process", tmp_path / "persistent"
    src.mkdir()
    for name, data in [("ansible.modules.stat-ZIP_DEFLATED-none", b"new stat"),
                       ("ansible.modules.command-ZIP_DEFLATED-none", b"new command"),
                       ("ansible.modules.copy-ZIP_DEFLATED-none.lock", b""),
                       ("ansible.modules.file-ZIP_DEFLATED-none-part", b"half"),
                       ("ansible.legacy.specab_node-ZIP_DEFLATED-none", b"the repository's module"),
                       ("ansible.legacy.my_role_module-ZIP_DEFLATED-none", b"a role's module")]:
        (src / name).write_bytes(data)
    dst.mkdir(mode=0o700)
    (dst / "ansible.modules.command-ZIP_DEFLATED-none").write_bytes(b"kept command")

    assert plugin.copy_new(src, dst) == 2
    assert sorted(p.name for p in dst.iterdir()) == ["ansible.legacy.specab_node-ZIP_DEFLATED-none",
                                                      "ansible.modules.command-ZIP_DEFLATED-none",
                                                      "ansible.modules.stat-ZIP_DEFLATED-none"]
    assert (dst / "ansible.modules.stat-ZIP_DEFLATED-none").read_bytes() == b"new stat"
    assert (dst / "ansible.modules.command-ZIP_DEFLATED-none").read_bytes() == b"kept command"
    assert plugin.copy_new(tmp_path / "absent", dst) == 0


def test_cache_is_keyed_by_the_ansible_core_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _plugin()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = plugin.persistent_dir()
    assert first.parent == tmp_path / "specab" / "ansiballz"
    monkeypatch.setattr(plugin.ansible, "__version__", "0.0.0-other")
    assert plugin.persistent_dir() != first


def test_an_edited_module_of_the_repository_gets_a_cache_of_its_own(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _plugin()
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "specab_node.py").write_text((REPO / "plugins" / "modules" / "specab_node.py").read_text())
    monkeypatch.setattr(plugin, "_MODULES", modules)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = plugin.persistent_dir()
    assert plugin.persistent_dir() == first
    (modules / "specab_node.py").write_text((modules / "specab_node.py").read_text() + "# edited\n")
    assert plugin.persistent_dir() != first


@pytest.mark.timeout(300)
def test_second_playbook_builds_no_ansible_core_payload_and_the_driver_loads_the_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory, playbook = _local(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.delenv("ANSIBLE_CALLBACK_PLUGINS", raising=False)

    # the driver's way: ansible-runner, whose own ANSIBLE_CALLBACK_PLUGINS would hide ansible.cfg's
    runner = PlaybookRunner(REPO, inventory, tmp_path / "runner", stream=lambda line: None)
    result = runner.run(str(playbook), {}, "first")
    assert result.status == "successful", result.stdout_tail
    assert _kept(cache) == ["ansible.legacy.specab_node-ZIP_DEFLATED-none", "ansible.modules.command-ZIP_DEFLATED-none",
                            "ansible.modules.stat-ZIP_DEFLATED-none"]

    # the README's way: ansible-playbook from the repository root (ansible.cfg), ansible's debug log on
    env = {**os.environ, "ANSIBLE_DEBUG": "1", "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "ok=2" in out and "skipped=1" in out
    assert CREATING not in out, "the second run rebuilt a payload the first one kept"
    assert "ANSIBALLZ: using cached module" in out
    # what the second run imported: each Python file of a kept payload has its bytecode beside it, compiled from
    # its own bytes for this Python (unchecked hash-based: zipimport takes it without compiling the source)
    for kept in cache.glob("specab/ansiballz/*/*"):
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(pickle.loads(kept.read_bytes()).zip_data))) as z:
            sources = [n for n in z.namelist() if n.endswith(".py") and "/" in n]
            assert any(n.endswith("module_utils/basic.py") for n in sources), kept.name
            for name in sources:
                pyc = z.read(name + "c")
                assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01
                assert pyc[8:16] == importlib.util.source_hash(z.read(name)), name
                code = compile(z.read(name), name, "exec", dont_inherit=True)
                assert marshal.loads(pyc[16:]).co_code == code.co_code, name


def test_a_payload_that_is_not_ansible_s_pickle_is_kept_as_it_is(tmp_path: Path) -> None:
    plugin = _plugin()
    src, dst = tmp_path / "process", tmp_path / "persistent"
    src.mkdir()
    (src / "ansible.modules.stat-ZIP_DEFLATED-none").write_bytes(b"not a pickle")
    assert plugin.copy_new(src, dst, bytecode=True) == 1
    assert (dst / "ansible.modules.stat-ZIP_DEFLATED-none").read_bytes() == b"not a pickle"
