#!/usr/bin/env bash
# SGLang 0.5.23's OWN argument parser in its own virtual environment (outside the project's .venv), for one
# thing only: running ServerArgs.add_cli_args + parse_args on the command lines specab renders
# (tests/real_engine/test_real_sglang_parser.py). SGLang does not SERVE on these CPUs
# (the facts of real engines on CPU: it needs sgl_kernel's CPU operators, which the registry's wheels lack).
#
# The package with --no-deps plus only what its parser imports (scripts/sglang-parser-requirements.txt, pinned;
# torch the 2.13.0 CPU build): about 2.2 GB and a few minutes, where `pip install sglang==0.5.23` with all its
# requirements was 11 GB and 6.5 min (torch 2.14.1 and its CUDA libraries).
#
#   scripts/install_sglang_parser.sh          # idempotent: a finished install is reused (a stamp file)
#   SPECAB_SGLANG_VENV=/path scripts/...      # default: ~/.cache/specab/sglang-0.5.23
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SPECAB_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specab/sglang-0.5.23}"
python="${PYTHON:-python3.11}"
stamp="$venv/.specab-installed"
reqs="$here/sglang-parser-requirements.txt"
want="parser:$(sha256sum "$reqs" | cut -c1-16)"
start=$(date +%s)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "sglang parser: reusing $venv (installed; delete it to reinstall)"
  exit 0
fi
command -v "$python" >/dev/null 2>&1 || { echo "install_sglang_parser.sh needs $python (set PYTHON=...)" >&2; exit 1; }
echo "sglang parser: installing SGLang 0.5.23's parser into $venv (about 2.2 GB, minutes the first time)"
# an earlier full install (or a different list) is replaced, not patched
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
quiet "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
# --no-compile, then compileall on every core (as scripts/install_vllm_cpu.sh does; a module that does not compile is
# left uncompiled, as pip leaves it)
quiet "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile --no-deps -r "$reqs"
"$venv/bin/python" -m compileall -qq -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
"$venv/bin/python" -c 'import argparse; from sglang.srt.server_args import ServerArgs; ServerArgs.add_cli_args(argparse.ArgumentParser())' \
  || { echo "sglang parser: SGLang's parser does not import from $reqs (see the error above)" >&2; exit 1; }
echo "$want" > "$stamp"
echo "sglang parser: installed in $(( $(date +%s) - start )) s"
