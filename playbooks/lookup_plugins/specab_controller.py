"""The controller that runs ansible-playbook: its host name and the pid of the ansible-playbook process (the
node lease's holder on the playbook path, playbooks/ab_test.yml and stop.yml).

A lookup is templated in a task's worker process, which ansible-playbook forked: the playbook's own pid is the
worker's parent (the worker itself is gone after the task, so its pid would make the lease look stale).
"""
from __future__ import annotations

import multiprocessing
import os
import socket

from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: specab_controller
short_description: the controller's host name and the ansible-playbook process id
description:
  - Returns one mapping with C(host) (socket.gethostname()) and C(pid) (the ansible-playbook process).
"""

RETURN = """
_raw:
  description: one mapping {host, pid}
  type: list
  elements: dict
"""


def _playbook_pid() -> int:
    """The ansible-playbook process: this process when it is the main one, else its parent (a worker)."""
    return os.getpid() if multiprocessing.current_process().name == "MainProcess" else os.getppid()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [{"host": socket.gethostname(), "pid": _playbook_pid()}]
