"""The tests' way of running the real command line, ``python -m tfrfs ARGS``, without paying for a
new interpreter and its imports each time.

The suite runs the command some two thousand times; a fresh interpreter importing tfrfs costs
about a third of a CPU second before the command does anything, which on CI's two cores was a
fifth of the whole run. So each test process starts one *command server* the first time it runs
a command: a fresh ``python`` (started the way ``python -m tfrfs`` is, in the same environment)
that imports the command line and what its commands use, then waits. For each command it forks,
and the child becomes the command: its standard input, output and error are the caller's (passed
over a Unix socket), its environment and working folder the caller's, ``sys.argv`` what
``python -m tfrfs`` sets, and it runs ``tfrfs/__main__.py`` as ``-m`` does, so the process exits
the way the command's own does (``sys.exit`` with its status, at-exit handlers, threads joined).
What differs is only what a fork shares: modules already imported. The daemon that
``tfrfs mount`` starts is still a new interpreter (``python -m tfrfs mount ... --daemon``).

``run(args, ...)`` answers like ``subprocess.run([python, "-m", "tfrfs", *args],
capture_output=True, text=True, ...)``. Variables an interpreter reads as it starts (``PYTHON*``,
``LD_*``, ...) are the server's own: a command whose environment sets them otherwise goes to a
server started with them (one per such environment). A call with keywords other than ``env``,
``cwd``, ``input`` and ``timeout`` runs as that subprocess. ``TFRFS_TEST_COMMAND_SERVER=0``
turns the servers off: every command then starts its own interpreter.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SWITCH = "TFRFS_TEST_COMMAND_SERVER"
# Variables read when an interpreter starts (or by modules the server imported once): a call that
# sets them otherwise than the server's own environment runs in an interpreter of its own.
_AT_START = ("PYTHON", "PROTOCOL_BUFFERS", "FUSE_LIBRARY", "LD_")


class CommandServer:
    """One server process and the socket it listens on (see the module's docstring)."""

    def __init__(self, environ: dict) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tfrfs-commands-"))
        self.address = str(self.folder / "socket")
        self.environ = dict(environ)
        # Its stdin is a pipe this process holds: when this process ends, the server sees the
        # end of it and ends too. Its own output (nothing, unless it fails) goes to a file.
        self.log = self.folder / "server.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, self.address], stdin=subprocess.PIPE,
                                         stdout=log, stderr=log, env=self.environ, cwd=str(self.folder))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        end_by_stdin(self.proc)
        shutil.rmtree(self.folder, ignore_errors=True)   # its socket and log

    def _connect(self, conn: socket.socket) -> None:
        """Connect to the server, which listens a moment after it starts (before its imports:
        a request sent while it imports waits for them)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                conn.connect(self.address)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if not self.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the tests' command server did not start: {self.log.read_text()[-2000:]}")
                time.sleep(0.005)

    def stands_in_for(self, env: dict) -> bool:
        """Whether a command with environment ``env`` can be a fork of this server."""
        return _started_with(env) == _started_with(self.environ)

    def run(self, args: list[str], env: dict, cwd: str, stdin: bytes | None, timeout: float | None
            ) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "tfrfs", *args]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                _stdin_file(stdin) as inp, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            self._connect(conn)
            request = json.dumps({"args": list(args), "env": env, "cwd": cwd}).encode()
            socket.send_fds(conn, [len(request).to_bytes(8, "big") + request],
                            [inp.fileno(), out.fileno(), err.fileno()])
            pid = int(_line(conn, None) or b"0")
            if not pid:
                raise RuntimeError(f"the tests' command server refused a command: {self.log.read_text()[-2000:]}")
            status = _await_status(conn, pid, argv, timeout)
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(argv, status, _text(out.read()), _text(err.read()))


def end_by_stdin(proc: subprocess.Popen, seconds: float = 10) -> None:
    """End a helper process that serves until its stdin ends: close it, wait ``seconds``, then
    kill it."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _line(conn: socket.socket, timeout: float | None) -> bytes:
    """The next line the server sends (read a byte at a time: the pid's line and the status's may
    come in one packet), or b"" if it closed the connection; ``TimeoutError`` after ``timeout``
    seconds."""
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            return b""
        data += chunk
    return data


def _await_status(conn: socket.socket, pid: int, argv: list[str], timeout: float | None) -> int:
    """The exit status the server reports for the command ``pid``; past ``timeout``, the command
    is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    try:
        line = _line(conn, timeout)
    except TimeoutError:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        _line(conn, 30)   # its status, once the server has reaped it
        raise subprocess.TimeoutExpired(argv, timeout or 0) from None
    if not line:
        raise RuntimeError("the tests' command server ended while a command ran")
    return int(line)


def _as_read(env: dict) -> dict:
    """``env`` as the FUSE binding reads it: it names libfuse3 itself when neither variable is set
    (tfrfs/fuse/binding.py), so a process that imported it (this one, say) differs in nothing."""
    if not (env.get("FUSE_LIBRARY_PATH") or env.get("FUSE_LIBRARY_NAME")):
        return dict(env, FUSE_LIBRARY_NAME="fuse3")
    return env


class _stdin_file:
    """The command's standard input: ``data`` in a file, or /dev/null (as ``subprocess.run`` with
    captured output and no input gives a child the parent's own stdin, which under pytest is
    nothing to read)."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data
        self.file: io.BufferedRandom | io.BufferedReader | None = None

    def __enter__(self):
        if self.data is None:
            self.file = open(os.devnull, "rb")
        else:
            self.file = tempfile.TemporaryFile()
            self.file.write(self.data)
            self.file.seek(0)
        return self.file

    def __exit__(self, *exc: object) -> None:
        assert self.file is not None
        self.file.close()


def _text(data: bytes) -> str:
    """``data`` decoded as ``subprocess.run(text=True)`` decodes (the locale's encoding, universal
    newlines)."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


_servers: dict[tuple, CommandServer] = {}   # by the variables read at start (_started_with)
_servers_lock = threading.Lock()


def _started_with(env: dict) -> tuple:
    """What of ``env`` an interpreter reads as it starts: the key of its server."""
    return tuple(sorted((k, v) for k, v in _as_read(env).items() if k.startswith(_AT_START)))


def _the_server(env: dict) -> CommandServer | None:
    """This process's server for commands with environment ``env``."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    key = _started_with(env)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive():
            server = _servers[key] = CommandServer(env)
        return server


def stop() -> None:
    """End this process's servers (at the end of a test session)."""
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


def run(args: list[str] | tuple[str, ...], *, timeout: float | None = None, env: dict | None = None,
        cwd: str | os.PathLike | None = None, input: str | bytes | None = None, **other: object
        ) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", "tfrfs", *args], capture_output=True, text=True, ...)``,
    through this process's command server where it can stand in (see the module's docstring)."""
    environ = dict(os.environ if env is None else env)
    server = _the_server(environ) if not other else None
    if server is None:
        return subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd, input=input, **other)  # type: ignore[call-overload]
    data = input.encode() if isinstance(input, str) else input
    where = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    return server.run([str(a) for a in args], environ, where, data, timeout)


# The server: run as ``python -c _SERVER ADDRESS``. It imports the command line and what the
# commands use, listens, and forks a child per request; the child becomes the command. No threads
# are ever started in it (a fork copies only the thread that forks).
_SERVER = r'''
import json, os, selectors, signal, socket, sys

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
import tfrfs.cli.parser, tfrfs.cli.common, tfrfs.cli.data, tfrfs.cli.mounting, tfrfs.cli.reshard
import tfrfs.cli.staged
for name in ("tfrfs.dataset.assembly", "tfrfs.dataset.factory", "tfrfs.edit.commit", "tfrfs.jobs.repair",
             "tfrfs.jobs.reshard", "tfrfs.jobs.indexing", "tfrfs.jobs.publish", "tfrfs.jobs.bucketrepair",
             "tfrfs.fuse.operations", "PIL.Image", "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "fsspec",
             "concurrent.futures.process", "multiprocessing.pool"):
    try:
        __import__(name)
    except ImportError:
        pass

wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *a: None)
sel = selectors.DefaultSelector()
sel.register(listener, selectors.EVENT_READ, "listener")
sel.register(wake_r, selectors.EVENT_READ, "child")
sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
waiting = {}   # pid -> the connection its exit status goes to


def recv_exactly(conn, n, fds):
    data = b""
    while len(data) < n:
        chunk, more, _, _ = socket.recv_fds(conn, n - len(data), 3)
        if not chunk:
            raise EOFError
        data += chunk
        fds += more
    return data


def become(conn, request, fds):
    """In the child: be ``python -m tfrfs ARGS`` with the caller's stdio, environment and folder."""
    listener.close()
    sel.close()
    for fd in (wake_r, wake_w):
        os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for other in waiting.values():
        other.close()
    conn.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()
    import runpy
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("tfrfs", run_name="__main__", alter_sys=True)


def serve():
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    return
            elif key.data == "child":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                while waiting:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = waiting.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                        except OSError:
                            pass
                        conn.close()
            else:
                conn, _ = listener.accept()
                fds = []
                try:
                    head = recv_exactly(conn, 8, fds)
                    request = json.loads(recv_exactly(conn, int.from_bytes(head, "big"), fds))
                except (EOFError, OSError, ValueError):
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    become(conn, request, fds)
                    sys.exit(0)   # tfrfs/__main__.py exits itself; this is for a module that did not
                for fd in fds:
                    os.close(fd)
                waiting[pid] = conn
                conn.sendall(b"%d\n" % pid)


serve()
'''
