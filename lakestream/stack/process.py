"""Background service processes: spawn detached, track by pid file, wait for ports, stop by pid.

Linux-only helpers (they read ``/proc``); the local stack is a development convenience and this
machine kind is Debian.
"""

from __future__ import annotations

import errno
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lakestream.stack.models import ServiceStatus

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the kernel picks it; racy but rarely reused soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct free ports (all held open while choosing, so they cannot repeat)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if a server could bind ``host:port`` (SO_REUSEADDR like real servers, so TIME_WAIT is ignored)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _reap(pid: int) -> None:
    # A child of this very process stays a zombie (and `kill -0` succeeds on it) until reaped.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process."""
    _reap(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def pid_cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (empty if gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class PidFile:
    """The pid of one service, with stale-file detection (dead pid, or pid reused by another program)."""

    def __init__(self, path: Path, executable_name: str):
        self.path = path
        self.executable_name = executable_name

    def read(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def write(self, pid: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{pid}\n")
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def live_pid(self) -> int | None:
        """The recorded pid if that process still runs our program; a stale pid file is removed."""
        pid = self.read()
        if pid is None:
            return None
        argv = pid_cmdline(pid)
        if pid_alive(pid) and argv and Path(argv[0]).name == self.executable_name:
            return pid
        self.remove()
        return None


def spawn_detached(
    argv: Sequence[str],
    log_path: Path,
    *,
    user: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Start ``argv`` in its own session (it outlives the caller), stdout+stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            user=user,
            start_new_session=True,
        )
    # Keep the Popen from warning when garbage-collected: the child is meant to outlive it.
    proc.returncode = 0
    return proc.pid


def run_logged(argv: Sequence[str], log_path: Path, *, cwd: Path | None = None, timeout: float = 120.0) -> int:
    """Run ``argv`` to completion, stdout+stderr appended to ``log_path``; its exit code."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            timeout=timeout,
            check=False,
        ).returncode


def stop_pid(pid: int, *, sig: int = signal.SIGTERM, timeout: float = 15.0) -> bool:
    """Send ``sig`` and wait; after ``timeout`` SIGKILL the whole process group. True if it stopped gracefully."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    if wait_until(lambda: not pid_alive(pid), timeout, 0.05):
        return True
    try:
        # start_new_session made the service a group leader: this also kills its workers.
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_until(lambda: not pid_alive(pid), 5.0, 0.05)
    return False


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def unreachable_for_user(path: Path, user: str) -> Path | None:
    """The first ancestor directory of ``path`` that OS user ``user`` cannot traverse, or None."""
    entry = pwd.getpwnam(user)
    groups = {entry.pw_gid} | {g for g in os.getgrouplist(user, entry.pw_gid)}
    for directory in [*reversed(path.resolve().parents), path.resolve()]:
        if not directory.exists():
            break
        st = directory.stat()
        if st.st_uid == entry.pw_uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return directory
    return None


def require_free_port(port: int, service: str, option: str) -> None:
    """Raise StackError naming the port and the setting to change if another process holds ``port``."""
    from lakestream.errors import StackError

    if not port_is_free(port):
        raise StackError(
            f"{service} port {port} on 127.0.0.1 is already in use by another process; choose another with {option}"
        )


class PidService:
    """A local service tracked by its pid file: its pid, a stop (SIGTERM, then SIGKILL after the timeout), a
    SIGKILL, and its status line. A subclass sets ``name``, ``pid_file``, ``port`` and ``persistent`` and defines
    ``healthy`` and ``detail``."""

    name: str
    pid_file: PidFile
    persistent: bool = False  # its state outlives a stop (a data directory, a database, a broker's topics)
    stop_timeout: float = 15.0  # seconds between SIGTERM and SIGKILL

    @property
    def port(self) -> int:
        """The port it serves on (from the stack's settings, or given to it)."""
        raise NotImplementedError

    def pid(self) -> int | None:
        return self.pid_file.live_pid()

    def healthy(self) -> bool:
        raise NotImplementedError

    @property
    def detail(self) -> str:
        return ""

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, SIGKILL after ``timeout`` (default `stop_timeout`)."""
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, timeout=self.stop_timeout if timeout is None else timeout)
        self.pid_file.remove()

    def kill(self) -> None:
        """SIGKILL (a crash: what it keeps on disk is found again by the next start)."""
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, sig=signal.SIGKILL, timeout=10)
        self.pid_file.remove()

    def status(self) -> ServiceStatus:
        pid = self.pid()
        return ServiceStatus(
            name=self.name,
            running=pid is not None,
            pid=pid,
            port=self.port,
            healthy=pid is not None and self.healthy(),
            persistent=self.persistent,
            detail=self.detail,
        )
