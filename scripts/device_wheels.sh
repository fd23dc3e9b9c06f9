#!/usr/bin/env bash
# The Python packages specab's controller needs on a GPU machine that has Python 3.12, torch, numpy,
# scipy, matplotlib, rich, jinja2, PyYAML and aiohttp but no network and no Ansible (the device image of
# docs/validation/): ansible-core and ansible-runner with their dependencies, as CPython 3.12 manylinux
# wheels in .whl/ (ignored through .git/info/exclude; 2.6 MB: cryptography, which ansible-core imports only for
# vault and SSH agents, is left out so that the wheels fit beside the SGLang bundle in one device call).
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$OUT" \
  ansible-core==2.19.14 resolvelib==1.2.0 \
  ansible-runner==2.4.2 pexpect==4.9.0 ptyprocess==0.7.0 python-daemon==3.1.2 lockfile==0.12.2
ls -1 "$OUT" >&2
