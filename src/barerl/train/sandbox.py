"""Run untrusted code (a model's program, a tool call) in a separate, limited and isolated process.

    sandbox = Sandbox(SandboxLimits(cpu_seconds=5, wall_seconds=10), require=("network",))
    result = sandbox.run_python("print(sum(range(10)))")
    result.stdout, result.status            # '45\\n', 'ok'
    sandbox.isolation().describe()          # what is in force on this machine, and why not the rest

Design decisions:
- One fresh process per run, started from a small stdlib-only script (`sandbox_init.py`) that isolates
  itself and then execs the interpreter on the program, so nothing of the trainer's process (memory,
  open files, threads, environment) is inherited. No `preexec_fn`: runs start from worker threads.
- Always: a fresh temporary directory as the working directory (deleted afterwards), a scrubbed
  environment (a fixed PATH, LANG and HOME only: no variable of the trainer's reaches the code),
  setrlimit limits on CPU seconds, address space, file size, open files and core files, a session of
  its own that is killed as a group, and a wall-clock deadline and output cap enforced by the caller,
  which kills the run on either.
- Where the system allows (root, or unprivileged user namespaces), four more isolations; each is
  reported (`Isolation`), and `require=(...)` refuses to run without the named ones:
  `network` (a new network namespace: no interface but a down loopback), `processes` (a PID namespace:
  every process the code starts dies with it, whatever it does with sessions), `filesystem` (a new root
  holding only read-only system directories, the Python installation, the work directory and a private
  /tmp: nothing else of the host is visible, let alone writable) and `unprivileged` (the code runs as
  an otherwise unused uid, so RLIMIT_NPROC bounds fork bombs and no host file is writable).
- Results are data, never exceptions: a program that fails, loops, floods its output or exhausts
  memory gives a `SandboxResult` saying so. `SandboxError` is for the sandbox itself (a required
  isolation missing, the bootstrap failing), i.e. for the operator, not for the model.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from barerl.train.config import ISOLATION_FEATURES, coerce_fields, opt

_INIT_SCRIPT = str(Path(__file__).with_name("sandbox_init.py"))
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
_REFUSED = 125  # sandbox_init's exit code when a required isolation is missing
_GRACE_SECONDS = 0.2  # output still read after the program exits (its children may hold the pipes)
_HOW_TO_ISOLATE = ("run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
                   "and user.max_user_namespaces > 0; AppArmor: kernel.apparmor_restrict_unprivileged_userns=0)")


class SandboxError(RuntimeError):
    """The sandbox cannot run code as asked: a required isolation is missing, or it failed to start."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. CPU and memory are per process of the run (setrlimit); wall time is for the run."""

    cpu_seconds: float = opt(10.0, "CPU seconds per process before it is killed (RLIMIT_CPU).", gt=0.0)
    wall_seconds: float = opt(20.0, "Wall-clock seconds per run before all its processes are killed.", gt=0.0)
    memory_mb: int = opt(1024, "Address space per process in MiB (RLIMIT_AS): allocations beyond fail.", min=16)
    output_bytes: int = opt(65536, "Bytes of stdout + stderr kept; a run printing more is killed.", min=1)
    file_bytes: int = opt(16 << 20, "Largest file the code may write, in bytes (RLIMIT_FSIZE).", min=0)
    tmp_mb: int = opt(64, "Size of the private /tmp in MiB (with filesystem isolation).", min=1)
    max_processes: int = opt(64, "Processes and threads the code may have at once (RLIMIT_NPROC; enforced "
                             "with `unprivileged` isolation or when not run as root).", min=1)

    def __post_init__(self):
        coerce_fields(self)


@dataclass(frozen=True)
class Isolation:
    """Which isolations are in force, and for each one that is not, why."""

    features: Mapping[str, bool]
    reasons: Mapping[str, str]

    def missing(self, names: Sequence[str]) -> list[str]:
        return [name for name in names if not self.features.get(name)]

    def describe(self) -> str:
        on = [name for name in ISOLATION_FEATURES if self.features.get(name)]
        off = [f"{name} ({self.reasons.get(name) or self.reasons.get('namespaces', 'unavailable')})"
               for name in ISOLATION_FEATURES if not self.features.get(name)]
        always = "rlimits, wall-clock kill of the process group, scrubbed environment, fresh directory"
        return f"always: {always}; in force: {', '.join(on) or 'none'}; missing: {', '.join(off) or 'none'}"


@dataclass
class SandboxResult:
    """What a run did. returncode: the program's exit code, or -N when signal N killed it."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    seconds: float
    isolation: Isolation

    @property
    def status(self) -> str:
        """ok | error (non-zero exit) | timeout | output_limit | cpu_limit | killed (another signal)."""
        if self.timed_out:
            return "timeout"
        if self.output_truncated:
            return "output_limit"
        if self.returncode == 0:
            return "ok"
        if self.returncode == -signal.SIGXCPU:
            return "cpu_limit"
        return "killed" if self.returncode < 0 else "error"

    def describe(self) -> str:
        """The run as a tool observation: what it printed, then how it ended when it did not end well."""
        parts = [self.stdout, self.stderr]
        notes = {"timeout": f"[timed out after {self.seconds:.1f}s]", "output_limit": "[output limit exceeded]",
                 "cpu_limit": "[CPU time limit exceeded]", "error": f"[exit code {self.returncode}]"}
        if self.status == "killed":
            notes["killed"] = f"[killed by {signal.Signals(-self.returncode).name}]"
        parts.append(notes.get(self.status, ""))
        return "\n".join(p.rstrip("\n") for p in parts if p) or "[no output]"


def _interpreter() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _read_only_paths() -> list[str]:
    """System directories, the Python installation, and the interpreter's folder when outside both."""
    paths = [p for p in _SYSTEM_DIRS if os.path.lexists(p)]
    for extra in (os.path.realpath(sys.base_prefix), os.path.dirname(_interpreter())):
        if not any(extra == p or extra.startswith(p + "/") for p in paths):
            paths.append(extra)
    return paths


def _write_files(folder: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = (folder / name).resolve()
        if not path.is_relative_to(folder.resolve()) or path == folder.resolve():
            raise SandboxError(f"sandbox file name {name!r} is not a path inside the work directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout and stderr until both close, the deadline passes or more than cap bytes arrive.
    Returns (stdout, stderr, timed_out, truncated)."""
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total, exited_at = 0, None
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()]), True, False
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _GRACE_SECONDS:
                break  # the program is gone; whatever still holds its pipes is killed with the group
            for key, _ in selector.select(min(deadline - now, 0.05)):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data[: max(cap - total, 0)])
                total += len(data)
            if total > cap:
                return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()]), False, True
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()]), False, False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    proc.kill()
    proc.wait()


def _read_status(fd: int) -> dict | None:
    """sandbox_init's setup line, merged with the exit-code line PID 1 of a PID namespace adds."""
    with os.fdopen(fd) as f:
        lines = f.read().splitlines()
    status: dict = {}
    for line in lines:
        status.update(json.loads(line))
    return status or None


class Sandbox:
    """Runs Python programs in isolated, limited processes; thread-safe (each run is its own process)."""

    def __init__(self, limits: SandboxLimits | None = None, require: Sequence[str] = (), isolate: bool = True):
        """require: isolations (of ISOLATION_FEATURES) without which nothing runs; isolate=False: limits
        only, no namespaces (for trusted code)."""
        unknown = [name for name in require if name not in ISOLATION_FEATURES]
        if unknown:
            raise SandboxError(f"unknown isolation {unknown}: choose from {list(ISOLATION_FEATURES)}")
        self.limits = limits or SandboxLimits()
        self.require = tuple(require)
        self.isolate = isolate
        isolation = self.isolation()
        missing = isolation.missing(self.require)
        if missing:
            why = "; ".join(f"{name}: {isolation.reasons.get(name) or isolation.reasons.get('namespaces')}"
                            for name in missing)
            raise SandboxError(f"required sandbox isolation {missing} is not available on this machine ({why}); "
                               f"to get it, {_HOW_TO_ISOLATE}; or do not require it")

    def isolation(self) -> Isolation:
        """The isolation this machine gives (probed once per process by running an empty program)."""
        return _probe_isolation(self.isolate)

    def run_python(self, code: str, *, stdin: str = "", files: Mapping[str, str] | None = None,
                   args: Sequence[str] = ()) -> SandboxResult:
        """Run `code` as main.py, with `files` beside it: `python -E -s -B main.py *args` in the work folder."""
        return self._run({**(files or {}), "main.py": code}, ["main.py", *args], stdin)

    def _run(self, files: Mapping[str, str], script_argv: list[str], stdin: str) -> SandboxResult:
        limits = self.limits
        with tempfile.TemporaryDirectory(prefix="barerl-sandbox-", ignore_cleanup_errors=True) as top:
            work, root = Path(top, "work"), Path(top, "root")
            work.mkdir()
            root.mkdir()
            _write_files(work, files)
            Path(top, "stdin").write_text(stdin)
            status_read, status_write = os.pipe()
            config = {
                "status_fd": status_write, "work_dir": str(work), "root_dir": str(root),
                "read_only_paths": _read_only_paths(), "tmp_bytes": limits.tmp_mb << 20,
                "uid": 1_000_000 + random.SystemRandom().randrange(1_000_000), "require": list(self.require),
                "isolate": self.isolate,
                "argv": [_interpreter(), "-E", "-s", "-B", *script_argv], "env": _ENV,
                "limits": {"cpu_seconds": limits.cpu_seconds, "memory_bytes": limits.memory_mb << 20,
                           "file_bytes": limits.file_bytes, "max_processes": limits.max_processes},
            }
            start = time.monotonic()
            with open(Path(top, "stdin"), "rb") as stdin_file:
                try:
                    proc = subprocess.Popen(
                        [_interpreter(), "-I", "-S", "-B", _INIT_SCRIPT, json.dumps(config)], stdin=stdin_file,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_write,),
                        start_new_session=True, env=_ENV, cwd=work)
                finally:
                    os.close(status_write)
            try:
                out, err, timed_out, truncated = _collect(proc, start + limits.wall_seconds, limits.output_bytes)
            finally:
                _kill_group(proc)
                proc.stdout.close()
                proc.stderr.close()
            seconds = time.monotonic() - start
            status = _read_status(status_read)
        if status is None:
            raise SandboxError(f"the sandbox failed to start (exit {proc.returncode}): "
                               f"{err.decode(errors='replace').strip()[-2000:]}")
        returncode = status.get("returncode", proc.returncode)
        if returncode == _REFUSED and status["missing"]:
            raise SandboxError(f"required sandbox isolation {status['missing']} is not in force: {status['reasons']}")
        return SandboxResult(returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                             timed_out, truncated, seconds, Isolation(status["features"], status["reasons"]))


@lru_cache(maxsize=2)
def _probe_isolation(isolate: bool) -> Isolation:
    if os.name != "posix":
        raise SandboxError("the sandbox needs a POSIX system (setrlimit, process groups)")
    sandbox = Sandbox.__new__(Sandbox)  # no requirement to check: this is the check
    sandbox.limits, sandbox.require, sandbox.isolate = SandboxLimits(), (), isolate
    return sandbox.run_python("").isolation
