"""The spawner process: starts every sandbox's bwrap on behalf of one runtime.

Run as a standalone script (``python -I -S _zygote.py FD UID GID``;
standard library only) with one end of a ``SOCK_SEQPACKET`` pair as ``FD``.
Its first message is a JSON list of paths (sent, not passed as arguments:
nothing on its command line names the state directory). It moves into a
mount namespace of its own holding only the mounts on the way to or under
those paths (what bwrap binds, the state directory, the cgroups it writes):
every bwrap copies its parent's mount table and reads all of it back once
per bind mount it makes, so the host's other mounts (``/sys`` and its
cgroup hierarchies, ``/run/netns``, ...) would cost at every open. It keeps
root as its effective uid but makes ``UID``/``GID`` its real ids and drops
every supplementary group, so that a child started with
``posix_spawn(resetids=True)`` (a ``vfork``: nothing of this process is
copied) runs as ``UID``/``GID`` with no groups and no capabilities.

Each request is one JSON message ``{"id", "argv", "env", "cgroups", "netns"}``
(and ``idmap``, ``[inside, outside, count]``: the uid and gid map the
spawner writes for bwrap's user namespace, which bwrap waits for with
``--userns-block-fd 4``)
(``env`` is bwrap's whole environment: nothing of this process's or the
runtime's own reaches a sandbox; ``argv`` starts bwrap with ``--info-fd 3 --block-fd 4``) carrying seven
descriptors: the child's 0 to 4 (stdin, stdout, stderr, the write end of its
info pipe, the read end of its block pipe), then the read end of the info
pipe and the write end of the block pipe, for the spawner; with ``netns``
true, an eighth: a network namespace, which the main thread enters just
for the ``posix_spawn`` (bwrap is born in it) and leaves right after. The spawner starts bwrap, reads
the pid of bwrap's child in the sandbox from the info pipe, moves both
processes into the ``cgroups`` (``cgroup.procs`` files), and only then lets
the child go on by writing to the block pipe: bwrap's child starts no
process before that, so the whole tree is in the session's cgroups. The
reply is ``{"id", "pid", "child_pid"}``, or ``{"id", "error"}`` (bwrap
failed, or the move did, and then both processes are killed). Requests are
served side by side, and replies come in any order.

Why a process of its own: ``subprocess`` in the runtime can only ``vfork``
when no uid or group changes, and forking the runtime costs far more than
this; and bwrap's ``--die-with-parent`` needs a parent *thread* that lives
as long as the runtime, which Trio's worker threads do not (here, bwrap is
always started from the main thread). The spawner exits when the runtime's
end of the socket closes (the runtime exited or was killed); bwrap's
``--die-with-parent`` then kills every sandbox it started.
"""

import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import sys
import threading
import time

# Descriptors received with a request: the child's 0, 1, 2, 3, 4, then the
# spawner's two, then (with "netns") the network namespace to start bwrap in.
_CHILD_FDS = 5
_FDS = _CHILD_FDS + 2
_CLONE_NEWNET = 0x40000000
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
# Received descriptors are moved above this, out of the way of the child's.
_HIGH_FD = 64
# bwrap writes its info right after its first clone: milliseconds.
_INFO_SECONDS = 5.0
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)


def _reap(signum, frame):  # type: ignore[no-untyped-def]
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _read_info(fd):  # type: ignore[no-untyped-def]
    """bwrap's --info-fd JSON, or None if the pipe ends first (bwrap failed)
    or nothing comes within ``_INFO_SECONDS`` (then the caller kills bwrap)."""
    data = b""
    deadline = time.monotonic() + _INFO_SECONDS
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        return info if isinstance(info, dict) and isinstance(info.get("child-pid"), int) else None


def _setns(fd):  # type: ignore[no-untyped-def]
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "setns: " + os.strerror(err))


def _start(request, fds, home_netns):  # type: ignore[no-untyped-def]
    """In the main thread, which lives as long as this process: bwrap's
    --die-with-parent follows the thread that started it. With a network
    namespace, the thread enters it for the spawn (the child is born in
    it) and comes back right after."""
    argv = request["argv"]
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds[:_CHILD_FDS])]
    netns = fds[_FDS] if len(fds) > _FDS else None
    try:
        if netns is not None:
            _setns(netns)
        try:
            return os.posix_spawn(
                argv[0],
                argv,
                request.get("env") or {},
                file_actions=actions,
                resetids=True,
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),
            )
        finally:
            if netns is not None:
                try:
                    _setns(home_netns)
                except OSError:
                    os._exit(1)  # never start a later sandbox in the wrong namespace
    finally:
        if netns is not None:
            os.close(netns)
            del fds[_FDS:]
        # Our copies of the child's ends: the info pipe must end when bwrap's do.
        for fd in fds[:_CHILD_FDS]:
            os.close(fd)
        fds[:_CHILD_FDS] = []


def _finish(request, pid, info_read, block_write):  # type: ignore[no-untyped-def]
    """In a thread of its own: wait for bwrap's child, move both into the
    cgroups, let the child go on."""
    info = _read_info(info_read)
    if info is None:
        try:
            os.kill(pid, signal.SIGKILL)  # if it is stuck rather than gone
        except OSError:
            pass
        return {"error": "bwrap exited before it started its sandbox"}
    child = info["child-pid"]
    step = "move bwrap into its cgroup"
    try:
        for path in request["cgroups"]:
            for member in (pid, child):
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, str(member).encode())
                finally:
                    os.close(fd)
        idmap = request.get("idmap")
        if idmap:
            # bwrap waits (--userns-block-fd) for the maps of its user namespace:
            # a range no single unprivileged process may write.
            step = "map the ids of bwrap's user namespace"
            inside, outside, count = (int(v) for v in idmap)
            line = f"{inside} {outside} {count}\n"
            for kind in ("uid_map", "gid_map"):
                fd = os.open(f"/proc/{child}/{kind}", os.O_WRONLY)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
    except OSError as exc:
        for member in (child, pid):
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass
        return {"error": f"could not {step}: {exc}"}
    os.write(block_write, b"x")
    return {"pid": pid, "child_pid": child}


_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2


def _unescape(field):  # type: ignore[no-untyped-def]
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _lean_mounts(keep):  # type: ignore[no-untyped-def]
    """Best effort: a private mount namespace (receiving, never sending,
    mount events) without the mounts bwrap has no use for."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return
    if libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return
    with open("/proc/self/mountinfo") as f:
        points = {_unescape(line.split()[4]) for line in f}

    def needed(point):  # type: ignore[no-untyped-def]
        inside = point.rstrip("/") + "/"
        return any(point == k or k.startswith(inside) or point.startswith(k + "/") for k in keep)

    for point in sorted(points, key=len, reverse=True):
        if point != "/" and not needed(point):
            libc.umount2(point.encode(), _MNT_DETACH)


def main():  # type: ignore[no-untyped-def]
    fd, uid, gid = (int(a) for a in sys.argv[1:4])
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    try:
        keep = json.loads(sock.recv(1 << 20) or b"[]")
    except OSError:
        return
    home_netns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    _lean_mounts([os.path.normpath(p) for p in keep])
    os.setgroups([])
    os.setresgid(gid, 0, 0)
    os.setresuid(uid, 0, 0)
    # A sandbox's pid 1 outlives bwrap when the sandbox's init is killed from
    # inside: reap it here rather than leave a zombie to a host init that may not.
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGCHLD, _reap)
    send_lock = threading.Lock()
    while True:
        try:
            message, received, _flags, _addr = socket.recv_fds(sock, 1 << 20, _FDS + 1, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return
        if not message:
            return  # the runtime is gone
        fds = [fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for r in received]
        for r in received:
            os.close(r)
        request = json.loads(message)
        try:
            expected = _FDS + 1 if request.get("netns") else _FDS
            if len(fds) != expected:
                raise OSError(f"expected {expected} descriptors, got {len(fds)}")
            pid = _start(request, fds, home_netns)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            _reply(sock, send_lock, request, {"error": f"{type(exc).__name__}: {exc}"})
            continue
        # Most of a spawn is waiting for bwrap to start: that part of each
        # request is served by a thread of its own, side by side.
        threading.Thread(target=_serve, args=(sock, send_lock, request, pid, fds), daemon=True).start()


def _serve(sock, send_lock, request, pid, fds):  # type: ignore[no-untyped-def]
    try:
        reply = _finish(request, pid, *fds)
    except OSError as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    _reply(sock, send_lock, request, reply)


def _reply(sock, send_lock, request, reply):  # type: ignore[no-untyped-def]
    reply["id"] = request["id"]
    try:
        with send_lock:
            sock.send(json.dumps(reply).encode())
    except OSError:
        pass  # the runtime is gone; the main thread sees it too


if __name__ == "__main__":
    main()
