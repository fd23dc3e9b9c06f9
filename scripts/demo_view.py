#!/usr/bin/env python3
"""`make demo`'s view of ab_test.yml: the whole Ansible output goes to a log file, the terminal gets one line
per arm step, any failure in full, and the results table as plain text.

    ansible-playbook playbooks/ab_test.yml 2>&1 | python3 scripts/demo_view.py runs/demo-ansible.log

Stdlib only; it selects lines, it computes nothing (the table is the playbook's).
"""
from __future__ import annotations

import re
import sys

STEP = re.compile(r"^TASK \[(?:\w+ : )?((?:Start \| Start arm|Bench \| Benchmark arm|Preflight \| Check the "
                  r"experiment)[^\]]*)\]")
FAILURE = re.compile(r"^(fatal:|failed:|ERROR!)")
ANNOUNCE = "TASK [Preflight | Announce the experiment]"
TABLE_TASK = "TASK [Collect | Print the results table]"


def _unquote(item: str) -> str:
    """A YAML plain or single-quoted scalar as its text (the callback quotes items that hold ': ' or quotes)."""
    if len(item) >= 2 and item[0] == item[-1] == "'":
        return item[1:-1].replace("''", "'")
    return item.strip('"')


def main(log_path: str) -> int:
    in_table = in_failure = in_announce = False
    announce: list[str] = []        # the experiment line, which Ansible folds over several lines
    item: list[str] = []            # the table's current line, which Ansible folds where it is long
    item_indent = 0

    def end_item() -> None:
        if item:
            print(_unquote(" ".join(item)), flush=True)
            item.clear()
    with open(log_path, "w", encoding="utf-8") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            text = line.rstrip("\n")
            if text.startswith("TASK [") or text.startswith("PLAY "):
                end_item()
                if announce:
                    print(" ".join(announce), flush=True)
                    announce = []
                in_table = text.startswith(TABLE_TASK)
                in_announce = text.startswith(ANNOUNCE)
                in_failure = False
                m = STEP.match(text)
                if m:
                    print(f"  {m.group(1)} ...", flush=True)
                elif text.startswith("PLAY RECAP"):
                    print(flush=True)
                continue
            if in_table:
                start = re.match(r"^(\s+)- (.*)$", text)
                if start:
                    end_item()
                    item_indent = len(start.group(1))
                    item.append(start.group(2).strip())
                elif item and text.strip() and len(text) - len(text.lstrip()) > item_indent:
                    item.append(text.strip())
                else:
                    end_item()
                continue
            if in_announce and text.strip() and not text.startswith("ok:"):
                announce.append(re.sub(r"^\s*msg: '?|'$", "", text).strip())
                continue
            if FAILURE.match(text) or in_failure:
                in_failure = bool(text.strip())
                print(text, flush=True)
    end_item()
    print(f"full Ansible output: {log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "ansible.log"))
