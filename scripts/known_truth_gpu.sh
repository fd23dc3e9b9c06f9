#!/usr/bin/env bash
# One device call on a GPU machine with no network (docs/validation/known-truth.md): unpack the SGLang bundle and
# byte-compile it (a first start without bytecode spends ~85 s importing), build the known-truth models on the GPU
# (`driver.py known-truth build`), then run the driver with the arguments given, and pack every run directory
# (model weights excluded) into $OUT/runs.tgz so they come back.
#
#   SPECAB_KT_MODELS='--preset gpu-4b --draft eagle3:0.9:1:eagle3' scripts/known_truth_gpu.sh \
#       -e experiments/known-truth-h200.yml --matrix steps=1,2,3 --repeats 2
#
# Needs .bundle/ (scripts/real_sglang_bundle.sh) and .whl/ (scripts/device_wheels.sh) in the checkout.
# SPECAB_KT_HISTORY: stores of earlier experiments (e.g. tests/fixtures/known-truth/h200/*, packed or not) whose measured noise and
# run cost go into the runs directory's node history first, as if they had ended there (`plan --target-ci`'s prior).
# SPECAB_KT_PLAN=1: print `driver.py plan` with the same arguments first ($OUT/plan.out).
# SPECAB_KT_RESTORE: a runs.tgz that an earlier call brought back, unpacked as the runs directory when this machine has
# none (a fresh machine: `--resume` then finds the store; SPECAB_KT_MODELS rebuilds the same seeded models).
# KT_DRIVER_S bounds the driver (default 480 s: a device call lasts at most 600 s); past it the driver gets SIGINT,
# keeps what finished and the run can go on with `driver.py --resume`.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
OUT=${OUT:?the folder whose files come back}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ ! -f /tmp/site2/.specab-unpacked ]; then
  mkdir -p /tmp/site2 /tmp/site
  cat .bundle/sglang-0.5.17-bundle.tar.xz* | xz -d | tar -x -C /tmp/site2
  python3 -m compileall -q -j 0 /tmp/site2 > /dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -2
  touch /tmp/site2/.specab-unpacked
  stamp "bundle unpacked and byte-compiled"
fi
python3 -m compileall -q -j 0 specab driver.py > /dev/null 2>&1
if [ -n "${SPECAB_KT_MODELS:-}" ]; then
  # shellcheck disable=SC2086
  PYTHONPATH=/tmp/site2:/tmp/site python3 driver.py known-truth build --out "${SPECAB_KT_OUT:-/tmp/kt}" \
    --device cuda $SPECAB_KT_MODELS | tee -a "$OUT/build.jsonl" || exit 1
  stamp "models built"
fi
RUNS=${SPECAB_KT_RUNS:-/tmp/rd}
if [ -n "${SPECAB_KT_RESTORE:-}" ] && [ ! -d "$RUNS" ]; then
  mkdir -p "$RUNS" && tar -xzf "$SPECAB_KT_RESTORE" -C "$RUNS" || exit 1
  stamp "runs directory restored from $SPECAB_KT_RESTORE"
fi
for store in ${SPECAB_KT_HISTORY:-}; do
  PYTHONPATH=/tmp/site python3 -c '
import sys, tempfile
from pathlib import Path
from specab.analysis import history, model
from specab.results.store import Store
from tests.stores import copy_store
src = Path(sys.argv[1])
d = copy_store(src, Path(tempfile.mkdtemp()) / src.name)       # fixtures keep their store packed
fp, doc = Store.open(d).fingerprint()
written = history.record(Path(sys.argv[2]), model.load_store(d, read_logs=False), fp, doc)
print("history of", src, "->", written or "nothing: no arm with two complete blocks")' "$store" "$RUNS" || exit 1
done
if [ "${SPECAB_KT_PLAN:-0}" = 1 ]; then
  PYTHONPATH=/tmp/site python3 driver.py plan -i inventory/gpu-real-sglang.yml --runs-dir "$RUNS" "$@" \
    > "$OUT/plan.out" 2>&1; grep -v '^---\|^[A-Z_]*=' "$OUT/plan.out" | grep -iv '^#\|^export\|^exec\|^set ' | tail -30
fi
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
rc=0
if [ $# -gt 0 ]; then
  PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH timeout -s INT -k 60 "${KT_DRIVER_S:-480}" \
    python3 driver.py -i inventory/gpu-real-sglang.yml --runs-dir "$RUNS" "$@" \
    > "$OUT/driver.out" 2>&1 || rc=$?
  stamp "driver rc=$rc"
  tail -45 "$OUT/driver.out"
fi
if [ -d "$RUNS" ]; then
  tar -C "$RUNS" --exclude='*.safetensors' -czf "$OUT/runs.tgz" . && ls -la "$OUT"
fi
stamp "done"
exit "$rc"
