#!/usr/bin/env bash
# specab GPU validation: run on a GPU machine from anywhere in the checkout.
#
#   scripts/gpu_validation.sh [--tp N] [--work DIR] [--time-scale S] [--python PY] [--cpu-sim]
#   scripts/gpu_validation.sh --engine real-sglang --real-site DIR [--no-driver] [--driver-timeout S] ...
#
# Runs playbooks/ab_test.yml against localhost (inventory/gpu-local.yml: real nvidia-smi, the
# simulated engine in GPU mode holding real CUDA memory and joining a real NCCL communicator), then
# the fault cases only real hardware can show (orphaned workers, an arm missing an NCCL variable, a
# foreign CUDA process), and prints the summary (a)-(e). Exit 0 only when every check passed.
# --engine real-sglang (docs/validation/sglang-real.md): the same with the REAL SGLang from the
# bundle of scripts/real_sglang_bundle.sh unpacked at --real-site (inventory/gpu-real-sglang.yml,
# experiments/real-sglang.yml), plus (f) the real engine's readiness, accept length and shutdown, and a
# short driver.py run of that experiment to a report, (g); --no-driver skips the driver run.
# Needs: python3 with torch (CUDA) and ansible-core 2.19 importable (PYTHONPATH may point at
# unpacked wheels; it is passed on to the engine). --tp 2 needs two GPUs.
# --cpu-sim: the same steps on a machine without GPUs (simulated nvidia-smi): a dry run of the logic.
set -euo pipefail

# NVLink multicast off in EVERY process started from here (the engine, NCCL, torch, the foreign
# CUDA process): a program that uses it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# ansible-core refuses a non-UTF-8 locale
if [[ "$(locale charmap 2>/dev/null || true)" != "UTF-8" ]]; then export LC_ALL=C.UTF-8 LANG=C.UTF-8; fi

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname -- "$here")"
py="${SPECAB_GPUVAL_PYTHON:-python3}"
prev=""
for arg in "$@"; do
  if [[ "$prev" == "--python" ]]; then py="$arg"; fi
  prev="$arg"
done
if ! "$py" -c 'import ansible, yaml' 2>/dev/null; then
  echo "gpu_validation.sh: $py cannot import ansible-core and PyYAML; install them (or the .whl/ wheels with" \
       "pip --target DIR and export PYTHONPATH=DIR), or set SPECAB_GPUVAL_PYTHON" >&2
  exit 2
fi
cd "$repo"
exec "$py" "$here/gpu_validation.py" run --python "$("$py" -c 'import sys; print(sys.executable)')" "$@"
