"""Code one screen at a time: no function in specab/ over 80 lines, no class over 300 (a function or class counted
from its `def`/`class` line to its last line, docstring, comments and blank lines inside included, as a reader
scrolls it). A longer one is split where its steps are; the limit is not raised."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def too_long(source: str, where: str) -> list[str]:
    """`where:line name (N lines, at most M)` for every function and class of `source` over its limit."""
    out = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{where}:{node.lineno} {node.name} ({lines} lines, at most {limit})")
    return out


def test_no_function_over_80_lines_and_no_class_over_300_in_specab():
    found = [f for p in sorted((REPO / "specab").rglob("*.py"))
             for f in too_long(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "split these where their steps are:\n" + "\n".join(found)


def test_the_check_finds_a_long_function_a_long_method_and_a_long_class():
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    assert too_long("def f():\n" + body, "x.py") == []                                  # 80 lines: at the limit
    assert too_long("def f():\n" + body + "    return 0\n", "x.py") == ["x.py:1 f (81 lines, at most 80)"]
    method = "    def m(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(80))
    assert too_long("class C:\n" + method, "x.py") == ["x.py:2 m (81 lines, at most 80)"]
    methods = "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(149))
    assert too_long("class C:\n" + methods, "x.py") == []                              # 299 lines
    methods += "    def last(self):\n        return 0\n"
    assert too_long("class C:\n" + methods, "x.py") == ["x.py:1 C (301 lines, at most 300)"]
