"""Env files: ``KEY=VALUE`` lines, values shell-quoted, read as the shell would (stdlib only)."""
from __future__ import annotations

import re
import shlex
from typing import Dict

from specab.node.cli import ToolError
from specab.vocab.contract import redact_text


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_ENV_FILE_WORDS = {"export", "set", "-a", "+a"}


def parse_env_text(text: str, where: str = "env file") -> Dict[str, str]:
    """``KEY=VALUE`` assignments (optionally ``export KEY=VALUE``), values shell-quoted, ``#`` comments.

    The whole text is tokenised as the shell would (a quoted value may span lines: a newline in a
    value is kept literally); ``set -a`` / ``set +a`` are allowed; any other word is refused.
    """
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    env: Dict[str, str] = {}
    try:
        while True:
            line = lexer.lineno
            tok = lexer.get_token()
            if tok is None or tok == lexer.eof:
                break
            if "=" in tok and _NAME_RE.match(tok.split("=", 1)[0]):
                k, v = tok.split("=", 1)
                env[k] = v
            elif tok not in _ENV_FILE_WORDS:
                raise ToolError("%s line %d: unexpected word %r (only KEY=VALUE assignments, export and "
                                "set -a/+a are allowed)" % (where, line, redact_text(tok)[:80]))
    except ValueError as exc:
        raise ToolError("%s line %d is not valid shell (%s)" % (where, lexer.lineno, exc))
    return env


def parse_env_file(path: str) -> Dict[str, str]:
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise ToolError("cannot read the env file %s: %s" % (path, exc))
    return parse_env_text(text, path)
