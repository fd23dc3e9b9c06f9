"""roles/specab/defaults/main.yml is the one place a default value stands (bench settings, timeouts, the GPU-free
threshold, the lease age, the queue's idle timeout, the sampling interval).

The node tools take those values as required arguments; the roles, playbooks and templates default from the
``specab_*`` variables; the driver reads the file through ``specab.config.defaults``. This test scans the node tools
and the controller's Python (AST) and the Ansible files (YAML, Jinja text) for a literal standing in for one of
those settings, and checks that the scanners find one planted in a copy of the code.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ONE_SOURCE = REPO / "roles" / "specab" / "defaults" / "main.yml"

# the names a setting goes by in Python (flags without "--", with "_"): any of them with a literal default is a copy
NAMES = {"api", "num_requests", "warmup", "warmup_requests", "input_len", "output_len", "ignore_eos", "concurrency",
         "client_procs",
         "seed", "timeout_s", "threshold_mib", "gpu_free_threshold_mib", "gpu_free_timeout", "gpu_free_s",
         "gpu_free_timeout_s", "stale_s", "lease_s", "lease_stale_s", "grace", "stop_grace", "stop_grace_s",
         "idle_timeout", "idle_timeout_s", "sample_interval_s", "ready_s", "ready_timeout_s"}
# the controller's own seed (driver.py --seed) orders the plan's blocks: another setting than bench.seed
CONTROLLER_OWN = {"seed"}
# generic names that are a setting only in these tools' flags and fields (elsewhere a poll interval or an HTTP
# timeout)
TOOL_NAMES = {"loadgen.py": {"timeout"}, "gpufree.py": {"timeout"}, "gpusample.py": {"interval"},
              "ready.py": {"timeout"}}
# a module constant named like one of the settings (DEFAULT_STALE_S = 600.0)
CONST_RE = re.compile(r"(STALE|LEASE_S|STOP_GRACE|THRESHOLD|IDLE_TIMEOUT|NUM_REQUESTS|WARMUP|INPUT_LEN|OUTPUT_LEN|"
                      r"SAMPLE_INTERVAL|READY_TIMEOUT|GPU_FREE_TIMEOUT|BENCH_TIMEOUT)")
# the Ansible variables' suffixes (bench_num_requests, gpu_free_threshold_mib, node_lease_stale_s, ...)
YAML_SUFFIXES = ("num_requests", "warmup_requests", "input_len", "output_len", "ignore_eos", "concurrency", "client_procs",
                 "bench_seed",
                 "timeout_s", "threshold_mib", "stale_s", "grace_s", "gpu_free_s", "ready_s", "sample_interval_s",
                 "bench_api")
JINJA_RE = re.compile(r"(\w+)\s*\|\s*default\(\s*(-?\d+(?:\.\d+)?|'[^']*'|\"[^\"]*\"|true|false|True|False)\s*"
                      r"(?:,[^)]*)?\)")

NODE = REPO / "specab" / "node"
CONTROLLER = [REPO / "specab" / "driver", REPO / "specab" / "config", REPO / "driver.py"]
ALLOWED = {REPO / "specab" / "config" / "defaults.py"}


def _literal(node: ast.AST | None) -> bool:
    """A constant standing in for a setting's value (a bool too: bench.ignore_eos is one)."""
    return isinstance(node, ast.Constant) and node.value is not None


def _flag_name(call: ast.Call) -> str | None:
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
            return arg.value[2:].replace("-", "_")
    return None


def python_copies(source: str, filename: str, node_tool: bool = True) -> list[str]:
    """Where ``source`` gives one of the settings a literal value: ``add_argument(--flag, default=...)``,
    ``mapping.get("key", literal)``, a dataclass field or a parameter with a literal default, a module constant."""
    params = NAMES if node_tool else NAMES - CONTROLLER_OWN
    names = params | TOOL_NAMES.get(Path(filename).name, set())
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "add_argument" and _flag_name(node) in names:
                for kw in node.keywords:
                    if kw.arg == "default" and _literal(kw.value):
                        found.append(f"{where}: --{_flag_name(node)} defaults to {ast.unparse(kw.value)}")
            if (node.func.attr == "get" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in names and _literal(node.args[1])):
                found.append(f"{where}: .get({node.args[0].value!r}, {ast.unparse(node.args[1])})")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and item.target.id in names):
                    continue
                # a field's default stands as the value or as field(default=...) / cli.arg(..., default=...)
                value = item.value
                if isinstance(value, ast.Call):
                    value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
                if _literal(value):
                    found.append(f"{filename}:{item.lineno}: field {node.name}.{item.target.id} = "
                                 f"{ast.unparse(item.value)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            pairs = list(zip(args[len(args) - len(node.args.defaults):], node.args.defaults))
            pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg in params and _literal(default):
                    found.append(f"{where}: parameter {node.name}({arg.arg}={ast.unparse(default)})")
    for stmt in ast.parse(source, filename).body:
        if isinstance(stmt, ast.Assign) and _literal(stmt.value) and isinstance(stmt.value.value, (int, float)):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and CONST_RE.search(target.id):
                    found.append(f"{filename}:{stmt.lineno}: constant {target.id} = {stmt.value.value!r}")
    return found


def jinja_copies(text: str, filename: str) -> list[str]:
    """``specab_x.num_requests | default(8)``-style literals in Jinja text."""
    return [f"{filename}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in JINJA_RE.finditer(text)
            if m.group(1).endswith(YAML_SUFFIXES)]


def yaml_copies(data: object, filename: str) -> list[str]:
    """A role default or an argument spec's ``default:`` for one of the settings given as a literal, not from its
    ``specab_*`` variable."""
    found = []

    def literal(value: object) -> bool:
        return value is not None and not (isinstance(value, str) and "{{" in value)

    if isinstance(data, dict) and "argument_specs" in data:
        for entry in (data["argument_specs"] or {}).values():
            for name, opt in ((entry or {}).get("options") or {}).items():
                if name.endswith(YAML_SUFFIXES) and isinstance(opt, dict) and literal(opt.get("default")):
                    found.append(f"{filename}: argument {name} defaults to {opt['default']!r}")
    elif isinstance(data, dict):
        for name, value in data.items():
            if str(name).endswith(YAML_SUFFIXES) and literal(value):
                found.append(f"{filename}: {name}: {value!r}")
    return found


def _python_files() -> list[Path]:
    files = sorted(NODE.glob("*.py"))
    for root in CONTROLLER:
        files += [root] if root.is_file() else sorted(root.rglob("*.py"))
    return [f for f in files if f not in ALLOWED]


def _ansible_files() -> list[Path]:
    files = [p for d in ("roles", "playbooks", "templates") for p in sorted((REPO / d).rglob("*"))
             if p.is_file() and p.suffix in (".yml", ".yaml", ".j2")]
    return [f for f in files if f != ONE_SOURCE]


def test_no_default_value_stands_outside_roles_specab() -> None:
    found = []
    for path in _python_files():
        found += python_copies(path.read_text(), str(path.relative_to(REPO)), node_tool=path.parent == NODE)
    for path in _ansible_files():
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        found += jinja_copies(text, rel)
        if path.parent.name in ("defaults", "meta") and path.suffix == ".yml":
            found += yaml_copies(yaml.safe_load(text), rel)
    assert not found, ("a default value stands outside roles/specab/defaults/main.yml; take it from there "
                       "(specab.config.defaults on the controller, a specab_* variable in Ansible, a required "
                       "argument in a node tool):\n" + "\n".join(found))


def test_the_scanners_find_a_planted_copy() -> None:
    """Each kind of copy, planted in a copy of the real code, is found."""
    loadgen = (NODE / "loadgen.py").read_text()
    planted = loadgen.replace('num_requests: int = cli.arg("measured requests")',
                              'num_requests: int = cli.arg("measured requests", default=8)')
    assert planted != loadgen and any("BenchConfig.num_requests = cli.arg('measured requests', default=8)" in f
                                      for f in python_copies(planted, "loadgen.py"))
    planted = loadgen.replace('choices=("true", "false"))', 'choices=("true", "false"), default="true")')
    assert planted != loadgen and any("BenchConfig.ignore_eos = cli.arg(" in f
                                      for f in python_copies(planted, "loadgen.py"))
    planted = loadgen.replace("    concurrency: int\n", "    concurrency: int = 4\n")
    assert planted != loadgen and any("BenchConfig.concurrency = 4" in f for f in python_copies(planted, "loadgen.py"))
    assert python_copies("p.add_argument('--num-requests', type=int, default=8)\n", "x.py")
    planted = loadgen.replace('_flag(bench["ignore_eos"], "ignore_eos")',
                              '_flag(bench.get("ignore_eos", True), "ignore_eos")')
    assert planted != loadgen and any(".get('ignore_eos', True)" in f for f in python_copies(planted, "loadgen.py"))
    planted = loadgen.replace('num_requests=int(bench["num_requests"])', 'num_requests=int(bench.get("num_requests", 8))')
    assert planted != loadgen and any(".get('num_requests', 8)" in f for f in python_copies(planted, "loadgen.py"))
    assert python_copies("class C:\n    stale_s: float = 600.0\n", "x.py")
    assert python_copies("class C:\n    stale_s: float = cli.arg('h', default=600.0)\n", "x.py")
    assert python_copies("class C:\n    stale_s: float = field(default=600.0)\n", "x.py")
    assert python_copies("def show(node_dir, stale_s=600.0):\n    pass\n", "x.py")
    assert python_copies("DEFAULT_STALE_S = 600.0\n", "x.py")
    assert python_copies("p.add_argument('--interval', type=float, default=1.0)\n", "gpusample.py")
    assert not python_copies("p.add_argument('--interval', type=float, default=0.1)\n", "gpufree.py")
    enqueue = (REPO / "playbooks" / "enqueue.yml").read_text()
    planted = enqueue.replace("specab_queue_timeouts.stop_grace_s }}", "specab_queue_timeouts.stop_grace_s | default(10) }}")
    assert planted != enqueue and jinja_copies(planted, "enqueue.yml")
    assert jinja_copies("n: \"{{ specab_queue_bench.num_requests | default(8) | int }}\"\n", "enqueue.yml")
    assert jinja_copies("e: \"{{ specab_queue_bench.ignore_eos | default(true) | bool }}\"\n", "enqueue.yml")
    assert yaml_copies({"bench_ignore_eos": True}, "roles/bench/defaults/main.yml")
    assert yaml_copies({"gpu_free_threshold_mib": 64}, "roles/gpu_free/defaults/main.yml")
    assert not yaml_copies({"gpu_free_threshold_mib": "{{ specab_gpu_free_threshold_mib }}"}, "x.yml")
    assert yaml_copies({"argument_specs": {"main": {"options": {"bench_timeout_s": {"default": 600}}}}}, "x.yml")
