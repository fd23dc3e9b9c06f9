"""Process names in messages (env verification, stop): what the process is survives the length cut, whatever
the depth of the interpreter's install path (a CI clone under /check/work/main failed on exactly this)."""
import subprocess
import sys
import time


from specab.node import procfs


def _named(pid, ready, within_s=10.0):
    """display_name once the child has reached the state `ready` accepts (polled; the last name otherwise)."""
    deadline = time.monotonic() + within_s
    name = procfs.display_name(pid)
    while not ready(name) and time.monotonic() < deadline:
        time.sleep(0.01)
        name = procfs.display_name(pid)
    return name


def test_an_untitled_process_is_named_by_its_program_and_module_not_its_install_path(tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4, "venv", "bin")
    deep.mkdir(parents=True)
    (deep / "python").symlink_to(sys.executable)
    proc = subprocess.Popen([str(deep / "python"), "-c", "import sys; sys.stdin.read()", "--served-model-name",
                             "x" * 80], stdin=subprocess.PIPE)
    try:
        name = _named(proc.pid, lambda n: not n.startswith("["))    # "[python]": not yet exec'd
        assert name.startswith("python -c import sys"), name
        assert len(name) <= 60 and name.endswith("…")
        # the full command (paths included) stays in the long description
        assert str(deep) in procfs.describe_process(proc.pid)["command"]
    finally:
        proc.communicate(b"")


def test_a_titled_process_keeps_its_title():
    import setproctitle  # noqa: F401 -- the simulator's dependency: titled children are what SGLang shows
    code = "import setproctitle, sys; setproctitle.setproctitle('sglang::scheduler_TP0'); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert _named(proc.pid, lambda n: n.startswith("sglang::")) == "sglang::scheduler_TP0"
    finally:
        proc.communicate(b"")
