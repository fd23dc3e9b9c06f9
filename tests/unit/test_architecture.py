"""The architecture holds: no import circle anywhere in specab, no module imports another's private name,
and the run order on a node exists once (specab.vocab.phases.RUN_STEPS), which the per-run playbooks
follow (the sequencer's own phase order is asserted in tests/node/test_sequence.py). The layers themselves
are `lint-imports` contracts (pyproject.toml), run by `make test`."""
from __future__ import annotations

import ast
import sys
import re
from pathlib import Path

import grimp
import numpy as np
import pytest
import yaml
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from specab.vocab import phases

REPO = Path(__file__).resolve().parents[2]


def test_no_import_circle_in_specab():
    graph = grimp.build_graph("specab", include_external_packages=False)
    mods = sorted(graph.modules)
    idx = {m: i for i, m in enumerate(mods)}
    edges = [(idx[m], idx[d]) for m in mods for d in graph.find_modules_directly_imported_by(m) if d in idx]
    rows, cols = zip(*edges)
    adj = csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(len(mods), len(mods)))
    n, labels = connected_components(adj, directed=True, connection="strong")
    circles = [sorted(m for m in mods if labels[idx[m]] == c) for c in range(n)]
    circles = [c for c in circles if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specab"):
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_no_module_imports_another_modules_private_name():
    bad = [b for p in sorted((REPO / "specab").rglob("*.py")) for b in _private_imports(p)]
    assert not bad, "\n".join(bad)


def _main_block_roles(playbook: Path) -> list[str]:
    """The role of every include_role of the run's main block, in order (the block's rescue, which cleans up a
    failed run, is not the run order)."""
    tasks = yaml.safe_load(playbook.read_text())
    block = next(t for t in tasks if "block" in t and str(t.get("name", "")).startswith("Run | One run"))
    out = []
    for t in block["block"]:
        role = (t.get("ansible.builtin.include_role") or {}).get("name")
        if role and role != "node_prepare":          # deploys the tools; no step of the run
            out.append(role)
    return out


def test_the_per_run_playbooks_follow_the_run_order():
    assert _main_block_roles(REPO / "playbooks/tasks/run_arm.yml") == [s.role for s in phases.RUN_STEPS]


def test_one_task_file_runs_an_arm_on_one_host_or_over_several():
    """Every per-run playbook, single-node and multi-node, and ab_test.yml's round include the one task file."""
    includes = {}
    for path in sorted((REPO / "playbooks").rglob("*.yml")):
        for m in re.finditer(r"include_tasks:\s*(\S+)", path.read_text()):
            includes.setdefault(m.group(1).strip("\"'"), []).append(path.relative_to(REPO).as_posix())
    assert sorted(includes["tasks/run_arm.yml"]) == ["playbooks/arm.yml", "playbooks/multinode_arm.yml"]
    assert includes["run_arm.yml"] == ["playbooks/tasks/ab_test_arm.yml"]
    assert not [p for p in (REPO / "playbooks").rglob("*run_arm*.yml") if p.name != "run_arm.yml"]


def _node_tasks(value) -> list[dict]:
    """Every `specab_node` task's arguments in a loaded task file, blocks and rescues included."""
    if isinstance(value, list):
        return [t for v in value for t in _node_tasks(v)]
    if isinstance(value, dict):
        return ([value["specab_node"]] if isinstance(value.get("specab_node"), dict) else []) + \
            [t for k, v in value.items() if k in ("block", "rescue", "always") for t in _node_tasks(v)]
    return []


def test_every_node_step_names_a_tool_of_the_node_package():
    """The module specab_node keeps no list of the tools: the node package's files are the one list (its launcher's
    `tools()`), and every task of the roles and playbooks names a tool in it."""
    from specab.node.__main__ import tools
    TOOLS = tools()
    files = [p for d in ("roles", "playbooks") for p in sorted((REPO / d).rglob("*.yml"))]
    tools = {(str(p.relative_to(REPO)), t["tool"]) for p in files for t in _node_tasks(yaml.safe_load(p.read_text()))}
    assert {t for _, t in tools} >= {"stop", "gpufree", "start", "ready", "envcheck", "bench", "manifest"}, tools
    assert not [(p, t) for p, t in tools if t not in TOOLS], sorted(tools)


def test_the_sequencer_names_its_phases_after_the_vocabulary():
    from specab.node import runqueue, runsteps
    assert runsteps.PHASES == phases.NODE_PHASES and runqueue.TASKS == phases.TASKS
    assert [p for p in phases.NODE_PHASES if p in {s.phase for s in phases.RUN_STEPS}] == \
        [s.phase for s in phases.RUN_STEPS]
    # every display phase the sequencer can report is one the driver knows
    assert set(phases.NODE_PHASES) == set(phases.DISPLAY_PHASES)


def test_each_role_of_a_run_step_is_one_phase():
    """On the per-run path a task's phase is its role's (specab.vocab.phases.phase_of_event): every step's role has
    one display phase, the one the sequencer reports for that step (the collect role, which writes the manifest
    and fetches the run, is collecting)."""
    for p in phases.PHASES:
        if p.role is not None:
            assert phases.ROLE_PHASES[p.role] == p.display, p
    for step in phases.RUN_STEPS:
        expected = "collecting" if step.role == "collect" else phases.display_phase(step.phase)
        assert phases.phase_of_event({"role": step.role, "task": "free text"}) == expected, step
    assert phases.phase_of_event({"task": "Stop | a task outside every role"}) is None


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement of a file, wherever it is (a function's lazy import too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def test_what_is_shipped_to_a_node_imports_the_stdlib_and_itself_only():
    """What node_prepare ships (specab.node, specab.vocab) imports, besides the standard library, only those two
    packages by their full name: an import of a sibling as a top-level module (after a sys.path change) would be
    invisible to the lint-imports contracts, and would not import where the package is shipped."""
    shipped = sorted([*(REPO / "specab" / "node").glob("*.py"), *(REPO / "specab" / "vocab").glob("*.py")])
    bad = [f"{p.relative_to(REPO)}:{line}: {mod}" for p in shipped for line, mod in _imported_modules(p)
           if mod.split(".")[0] not in sys.stdlib_module_names and not mod.startswith(("specab.node", "specab.vocab"))]
    assert not bad, "imports that are neither the standard library nor specab.node/vocab: " + ", ".join(bad)
    touch_path = [p.name for p in shipped if p.name != "__main__.py" and any(
        isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"
        for n in ast.walk(ast.parse(p.read_text())))]
    assert not touch_path, f"node tools that use sys.path (only the launcher, __main__.py, may): {touch_path}"


def _stray_docstrings(path: Path) -> list[str]:
    """String-literal statements that are not the first statement of a module, class or function
    (a docstring written after a statement is a no-op string, not the docstring)."""
    tree = ast.parse(path.read_text(), str(path))
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    bad = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if not isinstance(stmts, list):      # a lambda's or an if-expression's body is one expression
                continue
            for i, stmt in enumerate(stmts):
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str) \
                        and not (i == 0 and name == "body" and isinstance(node, scopes)):
                    bad.append(f"{path.relative_to(REPO)}:{stmt.lineno}")
    return bad


def test_no_docstring_after_a_statement():
    bad = [b for p in sorted((REPO / "specab").rglob("*.py")) for b in _stray_docstrings(p)]
    assert not bad, f"string statements that are not docstrings (make them comments): {bad}"

# --------------------------------------------------------------------------- one source of defaults

ANSIBLE_FILES = sorted([*(REPO / "playbooks").rglob("*.yml"), *(REPO / "roles").rglob("*.yml")])


def test_every_play_loads_specab_first():
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            roles = [r["role"] if isinstance(r, dict) else r for r in play.get("roles") or []]
            assert roles[:1] == ["specab"], f"{path.name}: play {play['name']!r} roles {roles}"


def test_no_numeric_default_outside_specab_and_each_default_is_used():
    import re

    from specab.config import defaults

    values = defaults.load()                   # plain values, no Jinja (load() checks)
    literal = re.compile(r"default\(\s*[0-9]")
    bad, text = [], ""
    for path in ANSIBLE_FILES:
        if path.relative_to(REPO).parts[:2] == ("roles", "specab"):
            continue
        body = path.read_text()
        text += body
        bad += [f"{path.relative_to(REPO)}:{i}: {line.strip()}" for i, line in enumerate(body.splitlines(), 1)
                if literal.search(line.replace("pid | default(0)", ""))]      # pid 0: "none yet" in check mode
    assert not bad, "numeric defaults belong in roles/specab/defaults/main.yml:\n" + "\n".join(bad)
    # a default the controller resolves in Python (specab/config/defaults.py readers) is used there
    text += "".join(p.read_text() for p in sorted((REPO / "specab").rglob("*.py")))
    unused = [k for k in values if k not in text]
    assert not unused, f"defaults nobody reads: {unused}"
