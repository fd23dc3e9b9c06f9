"""Keeps the AnsiballZ payloads of ansible-core's modules and the repository's own between ansible-playbook runs.

ansible-core zips each module with the module_utils it imports (AnsiballZ) once per ansible-playbook process, in a
cache under that process's own temporary directory (``local_tmp``), and deletes it at exit. specab runs a short
playbook per run, so every run rebuilt the same payloads (0.35-0.6 s each here): about a fifth of ansible-playbook's
CPU in the suite's e2e tests (a py-spy profile, docs/performance.md §7). This callback, loaded with every playbook
of the repository, copies the payloads a previous run built into the new process's cache before the first task, and
copies the new ones back when the playbook ends.

Kept: ansible-core's own modules (``ansible.modules.*``) and the repository's own modules (``plugins/modules``, run as
``ansible.legacy.<name>``: specab_node, in every per-run play), in a directory keyed by ansible-core's version, its
install path, the Python version and the bytes of the repository's module files, so an edited module is built
anew. A module of a role or collection, which can change without any of these changing, is built by ansible as
before. Nothing here changes what a task does; if ansible's cache is not where this expects it, the callback does
nothing.

A kept payload also carries the bytecode of its Python files. The module runs from the payload's zip, and Python's
zipimport compiles every ``.py`` it imports from a zip afresh, never caching: ansible.module_utils.basic alone took
~0.2 s of CPU per module run. Beside each ``X.py`` the kept zip holds ``X.pyc`` (unchecked hash-based, compiled by
the controller's Python from the same bytes), which zipimport prefers; a node whose Python has another magic number
ignores them and compiles the sources as before. A payload this cannot read is kept as ansible wrote it.
"""

from __future__ import annotations

DOCUMENTATION = """
name: ansiballz_cache
type: aggregate
short_description: keep the AnsiballZ payloads of ansible-core's and the repository's modules between playbook runs
description:
  - Copies the AnsiballZ payloads of ansible-core's and the repository's own modules from a persistent cache into
    the new process's ansiballz_cache before the first task, and the new ones back when the playbook ends.
  - The cache is C($XDG_CACHE_HOME/specab/ansiballz/<key>) (default C(~/.cache)), the key a hash of ansible-core's
    version, its install path, the Python version and the repository's module files (C(plugins/modules)).
requirements: []
"""

import base64
import dataclasses
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import ansible
from ansible import constants as C
from ansible.plugins.callback import CallbackBase

# the repository's own modules, which ansible runs as ansible.legacy.<file name>
_MODULES = Path(__file__).resolve().parents[1] / "modules"
# the cache file names start with the module's FQN: ansible-core's own, and the repository's
_PREFIXES = ("ansible.modules.",) + tuple(f"ansible.legacy.{p.stem}-" for p in sorted(_MODULES.glob("*.py")))


# in the cache's key: a cache written before its payloads carried bytecode is not reused
_FORMAT = "payloads with bytecode"


def persistent_dir() -> Path:
    """The cache directory for this ansible-core install, Python and the repository's module files."""
    sources = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(_MODULES.glob("*.py")))).hexdigest()
    key = "\0".join((ansible.__version__, os.path.dirname(ansible.__file__), sys.version, sources, _FORMAT))
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "specab" / "ansiballz" / hashlib.sha256(key.encode()).hexdigest()[:16]


def process_dir() -> Path | None:
    """This process's ansiballz_cache (ansible.executor.module_common), or None if local_tmp is not set."""
    local_tmp = getattr(C, "DEFAULT_LOCAL_TMP", None)
    return Path(local_tmp) / "ansiballz_cache" if isinstance(local_tmp, str) and local_tmp else None


def _kept(path: Path) -> bool:
    return path.is_file() and path.name.startswith(_PREFIXES) and not path.name.endswith((".lock", "-part"))


def with_bytecode(zip_data: bytes) -> bytes:
    """The zip with an unchecked hash-based ``.pyc`` beside each ``.py`` in a package that has none."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(zip_data)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        names = set(zin.namelist())
        for info in zin.infolist():
            source = zin.read(info)
            zout.writestr(info, source)
            if "/" in info.filename and info.filename.endswith(".py") and info.filename + "c" not in names:
                code = compile(source, info.filename, "exec", dont_inherit=True)
                pyc = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
                pyc.compress_type = zipfile.ZIP_DEFLATED
                # PEP 552: magic, flags 0b01 (hash-based, not checked against the source), the source's hash, the code
                zout.writestr(pyc, importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                              + importlib.util.source_hash(source) + marshal.dumps(code))
    return out.getvalue()


def _payload(path: Path) -> bytes:
    """The cache file's bytes, its payload given bytecode; the bytes as they are where it is not ansible's pickle of
    a zip (another ansible-core, a file of another kind)."""
    data = path.read_bytes()
    try:
        cached = pickle.loads(data)  # ansible's own _CachedModule, written by this machine's ansible-playbook
        zipped = with_bytecode(base64.b64decode(cached.zip_data))
        return pickle.dumps(dataclasses.replace(cached, zip_data=base64.b64encode(zipped)))
    except Exception:  # any payload this cannot rewrite is kept as ansible wrote it
        return data


def copy_new(src: Path, dst: Path, bytecode: bool = False) -> int:
    """Copy the kept payloads of `src` that `dst` lacks, each atomically (a temp file renamed), with bytecode added
    when `bytecode`; returns how many."""
    if not src.is_dir():
        return 0
    dst.mkdir(parents=True, exist_ok=True, mode=0o700)
    copied = 0
    for path in src.iterdir():
        target = dst / path.name
        if not _kept(path) or target.exists():
            continue
        fd, tmp = tempfile.mkstemp(dir=dst, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                if bytecode:
                    out.write(_payload(path))
                else:
                    with path.open("rb") as data:
                        shutil.copyfileobj(data, out)
            os.replace(tmp, target)
            copied += 1
        except OSError:
            Path(tmp).unlink(missing_ok=True)
    return copied


class CallbackModule(CallbackBase):
    """Primes this process's AnsiballZ cache when loaded; saves its new payloads at the end of the playbook."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self) -> None:
        super().__init__()
        self._process = process_dir()
        self._persistent = persistent_dir()
        if self._process is not None:
            try:
                copy_new(self._persistent, self._process)
            except OSError as exc:  # a cache that cannot be read costs only the rebuild
                self._display.vvv(f"ansiballz_cache: not primed from {self._persistent}: {exc}")

    def v2_playbook_on_stats(self, stats: object) -> None:
        if self._process is None:
            return
        try:
            copy_new(self._process, self._persistent, bytecode=True)
        except OSError as exc:
            self._display.vvv(f"ansiballz_cache: not saved to {self._persistent}: {exc}")
