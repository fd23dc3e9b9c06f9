"""The command-line words of spelled server args, as templates/launch_server.sh.j2 renders them, for tests that
hand an arm's flags to an engine's own parser (tests/unit/test_engines.py, tests/real_engine)."""
from __future__ import annotations

from typing import Any, Dict, List

from specab.vocab.engines import flag_of


def argv_of(server_args: Dict[str, Any]) -> List[str]:
    """The command-line words of (already spelled) server_args, exactly as templates/launch_server.sh.j2
    renders them: true -> bare flag; false/None -> omitted; list -> flag then each item; else flag value."""
    words: List[str] = []
    for key, value in server_args.items():
        if value is True:
            words.append(flag_of(key))
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            words += [flag_of(key)] + [str(v) for v in value]
        else:
            words += [flag_of(key), str(value)]
    return words
