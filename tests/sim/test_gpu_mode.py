"""GPU mode is opt-in: nothing imports torch on CPU, and asking for it without CUDA fails clearly."""
from __future__ import annotations

import subprocess

import pytest

from tests.sim.conftest import PY, REPO, base_env


def test_cpu_mode_never_imports_torch(tmp_path):
    code = ("import sys, specab.sim.launch_server, specab.sim.worker, specab.sim.engine, specab.sim.httpapi, "
            "specab.sim.smi, specab.sim.timing, specab.sim.watcher, specab.sim.hold; "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    r = subprocess.run([PY, "-c", code], env=base_env(tmp_path, 1), cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.split() == ["False", "False"], r.stderr
    worker = subprocess.run([PY, "-c", "import sys, specab.sim.worker; print(sorted(m for m in sys.modules "
                             "if m.split('.')[0] in ('aiohttp', 'numpy', 'torch', 'yaml')))"],
                            env=base_env(tmp_path, 1), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert worker.stdout.strip() == "[]", "the eight workers stay light"


def test_gpu_mode_without_cuda_fails_with_an_actionable_error(launch):
    try:
        import torch
        has_torch = True
        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is present: GPU mode would really run here")
    except ImportError:
        has_torch = False
    srv = launch([], env={"SPECAB_SIM_GPU": "cuda"}, scale=20, tp=1, wait=False)
    assert srv.wait_exit(60) != 0
    log = srv.log_text()
    assert "Scheduler hit an exception" in log
    if not has_torch:
        assert "GpuModeError: SPECAB_SIM_GPU=cuda needs PyTorch with CUDA" in log
    else:
        assert "GpuModeError" in log or "CUDA" in log
