"""Shared fixtures for the driver tests."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.driver.simnode import SimNode, free_port

EXPERIMENT = """\
specab_experiment:
  name: t
  model_path: /models/target
  server_args:
    tp_size: 2
    mem_fraction_static: 0.88
    trust_remote_code: true
    host: 127.0.0.1
    port: 30000
  env:
    NCCL_PROTO: LL
  arms:
    - name: baseline
    - name: eagle3-s2
      server_args:
        speculative_algorithm: EAGLE3
        speculative_draft_model_path: /models/draft
        speculative_num_steps: 2
        speculative_eagle_topk: 1
        speculative_num_draft_tokens: 3
  bench:
    api: generate
    num_requests: 3
    warmup_requests: 1
    input_len: 16
    output_len: 32
    concurrency: 1
    seed: 1
    timeout_s: 60
  timeouts:
    ready_s: 60
    stop_grace_s: 5
    gpu_free_s: 30
"""


@pytest.fixture
def write(tmp_path: Path):
    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text))
        return p
    return _write


@pytest.fixture
def experiment_file(write) -> Path:
    return write("exp.yml", EXPERIMENT)


@pytest.fixture
def node(tmp_path: Path):
    """A simulated node of its own (private state, node dir and port), cleaned up after the test; a module that
    needs another profile or more clean-up defines its own."""
    n = SimNode(root=tmp_path, port=free_port())
    yield n
    n.cleanup()
