"""The directory ansible-playbook was started in (for ab_test.yml's relative specab_experiment_file).

Ansible runs a local task in the playbook's directory, so a relative path given on the command line would be
read from playbooks/; lookups run in the controller's own process, whose current directory is the user's.
"""
from __future__ import annotations

import os

from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: specab_cwd
short_description: the current directory of the ansible-playbook process
description:
  - Returns the directory ansible-playbook was started in, so a relative path given with -e resolves from there.
"""

RETURN = """
_raw:
  description: one absolute path
  type: list
  elements: str
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [os.getcwd()]
