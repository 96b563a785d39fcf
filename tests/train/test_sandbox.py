"""The sandbox: limits end runaway programs with a result (never an exception), and escapes fail: the
network, the host's files, the trainer's environment and processes outliving the run. Escape tests that
need an isolation this machine lacks skip, naming it."""

import os
import socket
import sys
import time

import pytest

from barerl.train.sandbox import ISOLATION_FEATURES, Isolation, Sandbox, SandboxError, SandboxLimits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's isolation is Linux's")

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=4, memory_mb=256, output_bytes=4096, max_processes=16)


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(FAST)


def needs(sandbox, *features):
    missing = sandbox.isolation().missing(features)
    if missing:
        pytest.skip(f"isolation {missing} not available here: {sandbox.isolation().describe()}")


def _host_processes() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def test_runs_code_with_stdin_files_and_args(sandbox):
    code = "import sys, helper\nprint(helper.double(int(input())), sys.argv[1:])"
    result = sandbox.run_python(code, stdin="21\n", files={"helper.py": "def double(x):\n    return 2 * x\n"},
                                args=["a"])
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "42 ['a']\n")


def test_failures_are_results(sandbox):
    error = sandbox.run_python("raise ValueError('bad')")
    assert (error.status, error.returncode) == ("error", 1)
    assert "ValueError: bad" in error.stderr and "[exit code 1]" in error.describe()
    killed = sandbox.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert (killed.status, killed.returncode) == ("killed", -15)
    assert "[killed by SIGTERM]" in killed.describe()


def test_cpu_limit_ends_an_infinite_loop(sandbox):
    result = sandbox.run_python("while True:\n    pass")
    assert result.status == "cpu_limit" and result.seconds < FAST.wall_seconds


def test_wall_limit_ends_a_sleeper_and_its_children(sandbox):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)"
    limits = SandboxLimits(wall_seconds=1)
    before = _host_processes()
    result = Sandbox(limits).run_python(code)
    assert result.timed_out and result.status == "timeout" and result.seconds < 2
    assert "[timed out after" in result.describe()
    _wait_for_processes(before)


def _wait_for_processes(before: int, slack: int = 4) -> None:
    deadline = time.monotonic() + 5
    while _host_processes() > before + slack and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_processes() <= before + slack, "processes of the run outlived it"


def test_memory_limit_fails_a_huge_allocation(sandbox):
    result = sandbox.run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))")
    assert result.status == "error" and "MemoryError" in result.stderr
    assert sandbox.run_python("x = bytearray(4 * 2**30)").stderr.rstrip().endswith("MemoryError")


def test_output_limit_kills_a_flood(sandbox):
    result = sandbox.run_python("while True:\n    print('x' * 100)")
    assert result.status == "output_limit" and result.output_truncated
    assert len(result.stdout) + len(result.stderr) <= FAST.output_bytes
    assert "[output limit exceeded]" in result.describe()


def test_file_size_limit():
    result = Sandbox(SandboxLimits(file_bytes=1000)).run_python("with open('big', 'w') as f:\n    f.write('x' * 5000)")
    assert result.status == "error" and "File too large" in result.stderr


def test_environment_is_scrubbed(sandbox, monkeypatch):
    monkeypatch.setenv("BARERL_TEST_SECRET", "hunter2")
    result = sandbox.run_python("import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())")
    assert result.status == "ok" and "hunter2" not in result.stdout and "BARERL_TEST_SECRET" not in result.stdout
    assert set(eval(result.stdout.splitlines()[0])) <= {"PATH", "LANG", "PYTHONIOENCODING", "HOME", "TMPDIR"}


def test_host_processes_environment_is_unreadable(sandbox, monkeypatch):
    needs(sandbox, "processes")
    code = (f"import os\ntry:\n    print(open('/proc/{os.getpid()}/environ').read())\nexcept OSError as e:\n"
            "    print('denied', e)\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))")
    result = sandbox.run_python(code)
    assert result.status == "ok" and result.stdout.startswith("denied")
    assert len(eval(result.stdout.splitlines()[-1])) <= 3  # only the sandbox's own processes are visible


def test_fork_bomb_is_contained():
    sandbox = Sandbox(SandboxLimits(wall_seconds=2, cpu_seconds=2, max_processes=16))
    needs(sandbox, "processes", "unprivileged")
    before = _host_processes()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = sandbox.run_python(bomb)
    assert result.status in ("timeout", "cpu_limit")
    _wait_for_processes(before)


def test_writing_outside_the_work_directory_fails(sandbox, tmp_path):
    needs(sandbox, "filesystem")
    target = tmp_path / "escaped.txt"
    code = (f"import os\nfor path in [{str(target)!r}, '/usr/escaped.txt', '/escaped.txt', '../escaped.txt']:\n"
            "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
            "    except OSError as e:\n        print('refused', path, type(e).__name__)\n"
            "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())")
    result = sandbox.run_python(code)
    assert result.status == "ok" and "wrote" not in result.stdout and result.stdout.endswith("fine\n")
    assert not target.exists() and not os.path.exists("/usr/escaped.txt")


def test_host_files_are_invisible(sandbox):
    needs(sandbox, "filesystem")
    result = sandbox.run_python(f"import os\nprint(os.path.exists({__file__!r}), os.path.exists('/root/.ssh'))")
    assert result.stdout == "False False\n"


def test_sockets_cannot_reach_the_host(sandbox):
    needs(sandbox, "network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    print('connected')\nexcept OSError as e:\n    print('refused', e)")
        result = sandbox.run_python(code)
        server.settimeout(0.1)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the host's listening socket
    assert result.stdout.startswith("refused")


def test_limits_only_mode_runs_and_reports_no_isolation():
    sandbox = Sandbox(FAST, isolate=False)
    assert sandbox.run_python("print('hi')").stdout == "hi\n"
    assert not any(sandbox.isolation().features[name] for name in ("network", "processes", "filesystem"))
    assert "isolation turned off" in sandbox.isolation().describe()


def test_required_isolation_missing_is_refused_clearly(monkeypatch):
    with pytest.raises(SandboxError, match=r"required sandbox isolation \['network'\] is not available"):
        Sandbox(require=("network",), isolate=False)
    missing = Isolation({name: False for name in ISOLATION_FEATURES}, {"namespaces": "unshare: EPERM"})
    monkeypatch.setattr("barerl.train.sandbox._probe_isolation", lambda isolate: missing)
    with pytest.raises(SandboxError, match=r"\['network', 'filesystem'\].*unshare: EPERM.*user namespaces"):
        Sandbox(require=("network", "filesystem"))
    with pytest.raises(SandboxError, match="unknown isolation"):
        Sandbox(require=("gpu",))


def test_bad_file_names_and_limits_are_refused(sandbox):
    with pytest.raises(SandboxError, match="not a path inside"):
        sandbox.run_python("", files={"../x.py": ""})
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)
