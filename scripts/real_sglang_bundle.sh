#!/usr/bin/env bash
# Build the bundle that runs a REAL SGLang 0.5.17 EAGLE-3 server on a GPU machine that has torch 2.11
# (CUDA 13) but no network: every other Python package SGLang imports, from the package registry, for
# CPython 3.12 on manylinux x86_64, unpacked with `pip install --no-deps --target`, slimmed, packed as
# tar.xz. Why 0.5.17 and why these pins: docs/validation/sglang-real.md (and the facts it cites).
#
#   scripts/real_sglang_bundle.sh [--out DIR] [--split-mib N]
#
# Writes DIR/sglang-0.5.17-bundle.tar.xz (about 55 MB) and, when it is larger than N MiB (default 60:
# a device call carries at most 64 MiB with the working tree), DIR/sglang-0.5.17-bundle.tar.xz.part-NN
# pieces instead (`cat parts | xz -d | tar -x` puts it back). On the GPU machine:
#   xz -d < sglang-0.5.17-bundle.tar.xz | tar -x -C /tmp/site2 && export PYTHONPATH=/tmp/site2
# Nothing fetched is committed: DIR defaults to .bundle/ (ignored through .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.bundle
SPLIT_MIB=60
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --split-mib) SPLIT_MIB=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "real_sglang_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
# The pins that worked (a newer transformers clashes on 'qwen3_asr'; transformers 5.12.1 needs tokenizers
# <= 0.23.0 and huggingface-hub < 2; soundfile needs cffi; EAGLE-3's graph capture imports deep_gemm, whose
# 0.2.x fails to load against torch 2.11: sgl-deep-gemm 0.1.5.post1 works).
PKGS=(
  sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 huggingface-hub==1.33.0 flashinfer_python==0.6.15.post1
  annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 compressed-tensors==0.20.1 dill==0.4.1 fastapi==0.165.0
  gguf==0.19.0 httpx httpcore httpx2==2.16.2 ipython==9.18.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  loguru==0.7.3 msgspec==0.23.0 openai==3.57.0 opentelemetry-api==1.45.2 orjson==3.13.0
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5
  python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1
  soundfile==0.14.0 starlette==1.10.0 traitlets==5.16.1 typing-inspection==0.4.5 uvicorn==0.54.0 xgrammar==0.2.9
  cffi pycparser sgl-deep-gemm==0.1.5.post1
)
KERNEL=sglang-kernel==0.4.5
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
          --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
          --platform manylinux1_x86_64 --platform any)
mkdir -p "$OUT"
SITE=$(mktemp -d "${TMPDIR:-/tmp}/sglang-bundle.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
echo "real_sglang_bundle: installing ${#PKGS[@]} packages into $SITE/site" >&2
"$PY" -m pip install -q --no-deps --target "$SITE/site" "${PLATFORM[@]}" "${PKGS[@]}"
# the kernel package: without FA3 (flash_ops, 1.1 GB) and the sm100 (Blackwell) kernels; triton_kernels kept
"$PY" -m pip download -q --no-deps -d "$SITE/kernel" "${PLATFORM[@]}" "$KERNEL"
"$PY" - "$SITE/kernel" "$SITE/site" <<'PY'
import sys, zipfile
from pathlib import Path
whl = next(Path(sys.argv[1]).glob("*.whl"))
dest = Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name == "sgl_kernel/flash_ops.abi3.so" or (name.startswith("sgl_kernel/sm100/")
                                                     and "/triton_kernels/" not in name):
            continue
        z.extract(name, dest)
PY
find "$SITE/site" -name __pycache__ -type d -prune -exec rm -rf {} +
# The packages' own test suites (`tests/` folders: nothing imports them at serving time) are left out and the archive
# is packed at -9: with the working tree (~11 MiB) and .whl/ it must fit the device call's 64 MiB (49 MiB instead of
# 53). IPython stays: `import sglang` imports it.
find "$SITE/site" -name tests -type d -prune -exec rm -rf {} +
BUNDLE="$OUT/sglang-0.5.17-bundle.tar.xz"
tar -C "$SITE/site" -cf - . | xz -9 -T0 > "$BUNDLE"
size=$(stat -c %s "$BUNDLE")
echo "real_sglang_bundle: $BUNDLE $((size / 1048576)) MiB" >&2
if [ "$size" -gt $((SPLIT_MIB * 1048576)) ]; then
  split -b "${SPLIT_MIB}M" -d "$BUNDLE" "$BUNDLE.part-"
  rm -f "$BUNDLE"
  ls -1 "$BUNDLE".part-* >&2
fi
