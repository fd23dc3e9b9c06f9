"""Fixtures of the node-tool tests (the helpers live in tests/node/helpers.py)."""
from tests.node.helpers import server, sim  # noqa: F401  (pytest fixtures)
