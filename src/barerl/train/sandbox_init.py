"""The sandbox's first process: isolates itself, then replaces itself with the untrusted program.

Run as a script, never imported: `python -I -S -B sandbox_init.py CONFIG_JSON` (stdlib only, so that it
works before any isolation and with site-packages out of reach). `barerl.train.sandbox` starts it with a
scrubbed environment, in a session of its own, stdin/stdout/stderr connected, and a status pipe.

Steps, each recorded in the status line written to the status pipe before the program starts:
1. Namespaces: unshare new mount, PID, network, IPC and UTS namespaces (as root), or the same inside a new
   user namespace that maps only our own uid (unprivileged, where the kernel allows user namespaces).
   Failing that, a network namespace alone. Failing that, none.
2. With a PID namespace this process forks: the child is PID 1 of the namespace, and when it exits the
   kernel kills every process left in it. PID 1 builds the new root (step 3) and forks the program's
   process, then waits for it and writes its exit code to the status pipe (the kernel ignores signals
   without a handler sent to a PID 1, RLIMIT_CPU's SIGXCPU among them: the program cannot be PID 1).
3. With a mount namespace, a new root: an empty read-only tmpfs holding read-only binds of the system
   directories and of the Python installation, the work directory (read-write) at /sandbox, a private
   tmpfs at /tmp, /dev/{null,zero,random,urandom} and a /proc of the new PID namespace. pivot_root into it
   and detach the old root, so nothing else on the host's file systems is reachable.
4. Limits (setrlimit): CPU seconds, address space, file size, open files, no core files, and processes.
5. As root: become an otherwise unused uid/gid (chosen by the host) so that RLIMIT_NPROC is enforced and
   no file of the host is writable; then no_new_privs and death with the parent (PR_SET_PDEATHSIG).
6. A required isolation that is not in force stops here (exit 125) before the program runs.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# statvfs flags of a mount that a user namespace may not clear, and the mount(2) flags that keep them
_LOCKED_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                 (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
REFUSED = 125

libc = ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()
    _call(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {source or fstype} on {target}")


def _unshare(flags: int, what: str) -> None:
    _call(libc.unshare(ctypes.c_int(flags)), f"unshare({what})")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(features: dict, reasons: dict) -> bool:
    """Step 1. Returns whether the full set (mount + PID + network) is in force."""
    others = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    try:
        if uid == 0:
            _unshare(others, "mount, pid, net, ipc, uts")
        else:
            _unshare(CLONE_NEWUSER | others, "user, mount, pid, net, ipc, uts")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        features["network"] = True
        return True
    except OSError as e:
        reasons["namespaces"] = str(e)
    try:
        _unshare(CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET, "net")
        features["network"] = True
    except OSError as e:
        reasons["network"] = str(e)
    return False


def _bind_read_only(path: str, root: str) -> None:
    target = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:  # a file (/etc/ld.so.cache): its mount point is an empty file
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    _mount(path, target, None, MS_BIND | MS_REC)
    locked = os.statvfs(path).f_flag
    keep = sum(ms for st, ms in _LOCKED_FLAGS if locked & st)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def build_root(config: dict) -> None:
    """Step 3: a new root holding only what the program needs; pivot into it."""
    root = config["root_dir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in config["read_only_paths"]:
        if os.path.lexists(path):
            _bind_read_only(path, root)
    os.makedirs(root + "/sandbox")
    _mount(config["work_dir"], root + "/sandbox", None, MS_BIND | MS_REC)
    _mount(None, root + "/sandbox", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp_bytes']},mode=1777")
    os.makedirs(root + "/dev")
    for name in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    _call(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _call(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/sandbox")


def _own_tasks(uid: int) -> int:
    """Tasks (processes and threads) of uid on the system: what RLIMIT_NPROC counts."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue  # exited meanwhile
    return count


def apply_limits(limits: dict, nproc: int | None) -> None:
    """Step 4. nproc None: RLIMIT_NPROC is not set (root, who is exempt from it)."""
    cpu = max(1, int(limits["cpu_seconds"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def drop_user(uid: int) -> None:
    """Step 5 (root): the work directory becomes the new uid's, then the process does."""
    for folder, _, names in os.walk("."):
        for name in [folder, *(os.path.join(folder, n) for n in names)]:
            os.chown(name, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def wait_for_child(pid: int, status) -> None:
    """Steps 2-3, the waiting side: report how the program ended (-N for signal N) and end."""
    _, wait_status = os.waitpid(pid, 0)
    if status is not None:
        status.write(json.dumps({"returncode": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        status.close()
    os._exit(0)


def process_limit(config: dict, features: dict, reasons: dict, was_root: bool) -> int | None:
    """RLIMIT_NPROC for the program: it counts every task of a uid, and root is exempt from it."""
    max_processes = config["limits"]["max_processes"]
    if was_root and features["filesystem"]:
        return max_processes  # a fresh uid (step 5) starts with no task
    if was_root:
        reasons["unprivileged"] = "without a new root the interpreter may be unreadable to another uid"
        return None
    if features["processes"]:
        return max_processes  # counted within the new user namespace
    return _own_tasks(os.getuid()) + max_processes


def main() -> None:
    config = json.loads(sys.argv[1])
    status = os.fdopen(config["status_fd"], "w")
    was_root = os.getuid() == 0
    features = {"network": False, "filesystem": False, "processes": False, "unprivileged": not was_root}
    reasons: dict[str, str] = {}
    if not config["isolate"]:
        reasons["namespaces"] = "isolation turned off (Sandbox(isolate=False))"
    elif enter_namespaces(features, reasons):
        pid = os.fork()
        if pid:
            wait_for_child(pid, None)  # the bootstrap: outside the new PID namespace
        # PID 1 of the namespace: its processes die with it. The kernel ignores signals without a handler
        # sent to PID 1 (RLIMIT_CPU's SIGXCPU among them), so the program runs in a child of it.
        features["processes"] = True
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            build_root(config)
            features["filesystem"] = True
        except OSError as e:
            reasons["filesystem"] = str(e)
        pid = os.fork()
        if pid:
            wait_for_child(pid, status)
    if not features["filesystem"]:
        os.chdir(config["work_dir"])
    nproc = process_limit(config, features, reasons, was_root)
    apply_limits(config["limits"], nproc)
    if was_root and nproc is not None:
        drop_user(config["uid"])
        features["unprivileged"] = True
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    missing = [name for name in config["require"] if not features[name]]
    status.write(json.dumps({"features": features, "reasons": reasons, "missing": missing}) + "\n")
    status.close()
    if missing:
        os._exit(REFUSED)
    here = os.getcwd()
    env = {**config["env"], "HOME": here, "TMPDIR": "/tmp" if features["filesystem"] else here}
    os.execve(config["argv"][0], config["argv"], env)


if __name__ == "__main__":
    main()
