"""The spawner process: starts every sandbox's bwrap on behalf of one runtime.

Run as a standalone script (``python -I -S _zygote.py FD``; standard library
only) with one end of a ``SOCK_SEQPACKET`` pair as ``FD``. Each request is
one JSON message ``{"id", "argv", "cgroups", "uid", "gid"}`` (``argv[0]`` an
absolute path: the child cannot import anything once it is ``uid``) carrying file
descriptors that become the child's 0, 1, 2, 3, ... in order. The spawner
forks; the child writes its pid into each ``cgroups`` file (so the whole tree
is in the session's cgroups before it starts), drops to ``uid``/``gid`` with
no supplementary groups, and execs ``argv``. The reply is
``{"id", "pid"}`` once the exec succeeded, or ``{"id", "error"}``.

Why a process of its own: forking this small interpreter and changing
credentials in the child is cheaper than both forking the runtime (whose
``subprocess`` can only ``vfork`` when no uid or group changes) and running
a shell plus ``setpriv`` per sandbox; and bwrap's ``--die-with-parent``
needs a parent *thread* that lives as long as the runtime, which Trio's
worker threads do not. The spawner exits when the runtime's end of the
socket closes (the runtime exited or was killed); bwrap's
``--die-with-parent`` then kills every sandbox it started.
"""

import fcntl
import json
import os
import signal
import socket
import sys

_MAX_FDS = 16
# Received descriptors are moved above this before being placed at 0, 1, 2, ...
_HIGH_FD = 64


def _reap(signum, frame):  # type: ignore[no-untyped-def]
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _child(request, fds, err_w):  # type: ignore[no-untyped-def]
    """In the forked child: never returns."""
    try:
        err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)  # out of the way of 0, 1, 2, ...
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        pid = str(os.getpid()).encode()
        for path in request["cgroups"]:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        os.setgroups([])
        os.setresgid(request["gid"], request["gid"], request["gid"])
        os.setresuid(request["uid"], request["uid"], request["uid"])
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        argv = request["argv"]
        os.execv(argv[0], argv)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        try:
            os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:1000])
        finally:
            os._exit(127)


def _spawn(request, fds):  # type: ignore[no-untyped-def]
    err_r, err_w = os.pipe()
    # No reaping between the fork and the end of the exec check.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        pid = os.fork()
        if pid == 0:
            os.close(err_r)
            _child(request, fds, err_w)
        os.close(err_w)
        chunks = []
        while chunk := os.read(err_r, 1024):
            chunks.append(chunk)
        os.close(err_r)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    if chunks:
        return {"error": b"".join(chunks).decode(errors="replace")}
    return {"pid": pid}


def main():  # type: ignore[no-untyped-def]
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return
        if not message:
            return  # the runtime is gone
        request = json.loads(message)
        try:
            reply = _spawn(request, fds)
        except OSError as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for received in fds:
                os.close(received)
        reply["id"] = request["id"]
        try:
            sock.send(json.dumps(reply).encode())
        except OSError:
            return


if __name__ == "__main__":
    main()
