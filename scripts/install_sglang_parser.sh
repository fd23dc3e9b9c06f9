#!/usr/bin/env bash
# SGLang 0.5.23 from the package registry in its OWN virtual environment (11 GB with torch and its CUDA
# libraries; outside the project's .venv), for one thing only: running SGLang's own argument parser
# (ServerArgs.add_cli_args + parse_args) on the command lines specab renders (tests/real_engine/
# test_real_sglang_parser.py). SGLang does not SERVE on these CPUs (shared/facts/real-engines-on-cpu.md: it
# needs sgl_kernel's CPU operators, which the registry's wheels lack); its parser imports and runs.
#
#   scripts/install_sglang_parser.sh          # idempotent: a finished install is reused (a stamp file)
#   SPECAB_SGLANG_VENV=/path scripts/...      # default: ~/.cache/specab/sglang-0.5.23
set -euo pipefail
venv="${SPECAB_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specab/sglang-0.5.23}"
python="${PYTHON:-python3.11}"
stamp="$venv/.specab-installed"
want="sglang==0.5.23"
start=$(date +%s)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "sglang parser: reusing $venv (installed; delete it to reinstall)"
  exit 0
fi
command -v "$python" >/dev/null 2>&1 || { echo "install_sglang_parser.sh needs $python (set PYTHON=...)" >&2; exit 1; }
echo "sglang parser: installing $want into $venv (about 11 GB, 6.5 min the first time here)"
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
quiet "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
quiet "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
"$venv/bin/python" -c 'import argparse; from sglang.srt.server_args import ServerArgs; ServerArgs.add_cli_args(argparse.ArgumentParser())'
echo "$want" > "$stamp"
echo "sglang parser: installed in $(( $(date +%s) - start )) s"
