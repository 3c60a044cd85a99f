"""The root side of a private run (see :mod:`._private`), a standalone script.

Run as ``python -I -S _private_init.py FD`` (standard library only) by
the exec wrapper, as the host's root, already in the session's cgroup leaf.
It must never run a program, load a library or import a module from the
session's files while it is root: the session's ``/`` belongs to the
sandbox user, who can replace ``/lib64`` (the ELF interpreter of every
program) or create ``/root`` (where this interpreter's modules may live).
So everything is imported, and libc loaded, before it enters the
session's mount namespace; from then on it works by system calls only,
``sys.path`` is emptied so an import fails instead, and the one program it
starts (``env``, then the command) starts as uid 1000 with no capabilities,
from a root it rebuilt with the host's own layout.

``FD`` is a Unix stream socket to the runtime, which first sends the
configuration (its length as 8 bytes, big-endian, then JSON; sent, not
passed as an argument, so a command of any length fits): ``fds``
(descriptors of the session's ``user``, ``mnt``, ``uts``, ``ipc``, ``net``
and ``cgroup`` namespaces), ``top`` (the Harbor directory's name),
``sub`` (components of the private directory beneath it), ``size`` and
``source`` of the private tmpfs, ``userland`` (names whose host layout is
reproduced), ``reserved`` (every userland name, reproduced or not),
``session_entries`` (the session's own top-level mounts, made
before the entries the agent made), ``host_uid``, ``inside_uid``, ``max_entries``,
``inputs`` (``[name, size]`` of each Harbor directory that is a fresh
tmpfs of that size instead of the session's, for the runtime to fill),
``home`` and ``home_size`` (the top-level name and size of the command's
fresh ``HOME`` tmpfs), ``program`` and
``argv`` (``env``'s absolute path on the host's userland, and ``env -i -C
...`` with the command) and ``env`` (the environment ``env`` starts in).

Steps: join the namespaces but the user and pid ones; a private copy of the
mounts and a new pid namespace (a child of the host's); fork its pid 1, which
mounts a fresh ``/proc``, builds the new root (a tmpfs: the host's symlinks
and userland binds, clones of the session's other top-level entries, and on
``top`` the private tmpfs with ``sub`` in it and clones of ``top``'s other
entries, on each ``inputs`` name an empty tmpfs, on ``home`` another),
sends the runtime descriptors of the private tmpfs and of the inputs ones,
in that order, with ``ready``, waits for ``go`` (the runtime writes the
inputs meanwhile), then starts the command in the session's user
namespace as uid/gid 1000 and reaps until it ends. The first process waits
for pid 1 and exits with its status; a failure before ``ready`` is one line
on stderr and exit status 125.

A container that shares the host's user namespace (Docker without user
namespace remapping) has no user namespace to enter: its configuration has
no ``user`` descriptor and a ``confine`` object instead, the container's own
confinement, which the command gets as an exec in it would: ``cgroup_procs``
(the container's ``cgroup.procs`` files, joined first), ``parent`` (the
runtime's pid: the script dies with it), ``filters`` (the container's
seccomp filters, oldest first, each a base64 ``sock_filter`` array), ``no_new_privs``,
``bounding`` (its capability bounding set, a bit mask), ``uid``, ``gid``,
``groups`` and ``cwd``. The command then starts, as that user, from the
``argv`` looked up on the ``env``'s ``PATH``, with no other capability, no
descriptor but 0, 1 and 2, and the container's filters installed last.
"""

import array  # noqa: F401 - imported late by socket.send_fds
import base64
import ctypes
import errno
import json
import os
import signal
import socket
import stat
import sys
import warnings  # noqa: F401 - imported late by parts of os
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_NR_OPEN_TREE, _NR_MOVE_MOUNT, _NR_FSOPEN, _NR_FSCONFIG, _NR_FSMOUNT = 428, 429, 430, 431, 432
_FSOPEN_CLOEXEC = 1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOEXEC = 0x2, 0x4, 0x8
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused(Exception):
    pass


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args: int | bytes | None) -> int:
    converted = [a if isinstance(a, bytes) or a is None else ctypes.c_long(a) for a in args]
    return int(_libc.syscall(ctypes.c_long(number), *converted))


def _fs(fstype: str, options: list[tuple[str, str]], attrs: int) -> int:
    """A new, detached mount of ``fstype`` (a descriptor of its root)."""
    fs = _check(_syscall(_NR_FSOPEN, fstype.encode(), _FSOPEN_CLOEXEC), f"fsopen {fstype}")
    try:
        for key, value in options:
            _check(_syscall(_NR_FSCONFIG, fs, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0), f"fsconfig {key}")
        _check(_syscall(_NR_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0), f"create {fstype}")
        return _check(_syscall(_NR_FSMOUNT, fs, _FSMOUNT_CLOEXEC, attrs), f"fsmount {fstype}")
    finally:
        os.close(fs)


def _attach(mount_fd: int, dir_fd: int, name: str) -> None:
    _check(
        _syscall(_NR_MOVE_MOUNT, mount_fd, b"", dir_fd, name.encode(), _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {name}"
    )


def _clone_entry(src_dir: int, name: str, dst_dir: int) -> None:
    """Reproduce ``src_dir/name`` in ``dst_dir``: a directory or a regular
    file as a recursive bind of it, a symlink as a copy of it, anything
    else not at all. Never follows a link."""
    info = os.lstat(name, dir_fd=src_dir)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
        return
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW
    tree = _check(_syscall(_NR_OPEN_TREE, src_dir, name.encode(), flags), f"open_tree {name}")
    try:
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(name, 0o755, dir_fd=dst_dir)
        else:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dst_dir))
        _attach(tree, dst_dir, name)  # a type swapped meanwhile: refused (ENOTDIR / EISDIR)
    finally:
        os.close(tree)


def _clone_entries(src_dir: int, dst_dir: int, skip: set[str], limit: int) -> None:
    """Best effort over names the sandbox chose: whatever fails is left out."""
    with os.scandir(src_dir) as entries:
        names = sorted(e.name for e in entries)
    for name in [n for n in names if n not in skip][:limit]:
        try:
            _clone_entry(src_dir, name, dst_dir)
        except OSError:
            pass


def _build_root(
    config: dict[str, Any], session_root: int, root_dir: int, private_dir: int, fresh: list[tuple[str, int]]
) -> None:
    """The new root in ``root_dir``: the host's userland layout, the fresh
    /proc, the session's other top-level entries, ``top``, and the
    ``fresh`` tmpfses (``[(name, mount descriptor)]``: the inputs' and
    ``home``) in place of what the session has of those names."""
    top = config["top"]
    host_uid = config["host_uid"]
    for name, kind, target in config["userland"]:
        if kind == "symlink":
            os.symlink(target, name, dir_fd=root_dir)
        else:
            _clone_entry(session_root, name, root_dir)
    proc = _fs("proc", [], _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOEXEC)
    os.mkdir("proc", 0o555, dir_fd=root_dir)
    _attach(proc, root_dir, "proc")
    os.close(proc)
    # Userland names are the host's or nothing: never what the agent put there.
    skip = {*config["reserved"], "proc", top, *(name for name, _ in fresh)}
    # The session's own mounts first: no number of names the agent made pushes them out.
    for name in config["session_entries"]:
        if name not in skip:
            try:
                _clone_entry(session_root, name, root_dir)
            except OSError:
                pass
    _clone_entries(session_root, root_dir, skip | set(config["session_entries"]), config["max_entries"])
    # The Harbor directory: the private tmpfs, the path to the private
    # directory in it, and clones of the directory's other entries.
    here = os.open(".", _DIR, dir_fd=private_dir)
    try:
        for name in config["sub"]:
            os.mkdir(name, 0o755, dir_fd=here)
            os.chown(name, host_uid, host_uid, dir_fd=here, follow_symlinks=False)
            step = os.open(name, _DIR, dir_fd=here)
            os.close(here)
            here = step
    finally:
        os.close(here)
    try:
        original = os.open(top, _DIR, dir_fd=session_root)
    except OSError:
        original = None  # none, or a link or file the agent made: the private one is all there is
    if original is not None:
        try:
            if config["sub"]:
                _clone_entries(original, private_dir, {config["sub"][0]}, config["max_entries"])
        finally:
            os.close(original)
    os.mkdir(top, 0o755, dir_fd=root_dir)
    _attach(private_dir, root_dir, top)
    for name, mount_fd in fresh:
        os.mkdir(name, 0o755, dir_fd=root_dir)
        _attach(mount_fd, root_dir, name)


def _become_sandbox_user(config: dict[str, Any]) -> None:
    """In the command's process: no supplementary group (dropped while
    still the host's root: the session's user namespace denies setgroups),
    the session's user namespace, the new root (the current directory),
    uid/gid 1000, no capability left to inherit, no descriptor but 0, 1, 2."""
    os.setgroups([])
    _check(_libc.setns(config["fds"]["user"], 0), "setns user")
    os.chroot(".")
    os.chdir("/")
    if config.get("keep_capabilities"):
        # Over an image, root inside keeps its capabilities in the session's
        # user namespace (as the session's own commands do): none reaches
        # the private run's pid or mount namespace, which the host's root owns.
        inside, group = config["inside_uid"], config.get("inside_gid", config["inside_uid"])
        os.setresgid(group, group, group)
        os.setresuid(inside, inside, inside)
        os.closerange(3, 1 << 20)
        return
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    inside = config["inside_uid"]
    os.setresgid(inside, inside, inside)
    os.setresuid(inside, inside, inside)
    os.closerange(3, 1 << 20)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _become_container_user(confine: dict[str, Any], filters: list[ctypes.Array[_SockFilter]]) -> None:
    """In the command's process (the container shares the host's user
    namespace): the new root, the container's user and groups, its
    capability bounding set and nothing inheritable, its no_new_privs, no
    descriptor but 0, 1, 2, and its seccomp filters last (they allow what
    a container's exec needs: ``setresuid``, ``execve``)."""
    os.chroot(".")
    os.chdir("/")
    try:
        os.chdir(confine["cwd"] or "/")
    except OSError:
        pass  # as an exec whose working directory is gone: it starts at /
    os.setgroups(confine["groups"])
    os.setresgid(confine["gid"], confine["gid"], confine["gid"])
    for cap in range(64):
        if confine["bounding"] >> cap & 1:
            continue
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "read capabilities")
    for part in data:
        part.inheritable = 0
    _check(_libc.capset(ctypes.byref(header), data), "clear inheritable capabilities")
    os.closerange(3, 1 << 20)
    if confine["no_new_privs"]:
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for program in filters:
        fprog = _SockFprog(len(program), program)
        _check(
            _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
            "install the container's seccomp filter",
        )
    os.setresuid(confine["uid"], confine["uid"], confine["uid"])


def _pid1(
    config: dict[str, Any], sock: socket.socket, session_root: int, filters: list[ctypes.Array[_SockFilter]]
) -> None:
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    attrs = _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOSUID
    size = [("size", str(config["size"])), ("mode", "0755")]
    owner = [("uid", str(config["host_uid"])), ("gid", str(config["host_uid"]))]
    root_options = [("source", config["source"] + "-root"), ("size", "4m"), ("nr_inodes", "4096"), ("mode", "0755")]
    root_dir = _fs("tmpfs", [*root_options, *owner], attrs)
    private_dir = _fs("tmpfs", [("source", config["source"]), *size, ("nr_inodes", "65536"), *owner], attrs)
    fresh = []
    for name, input_size in config["inputs"]:
        options = [("source", f"{config['source']}-{name}"), ("size", str(input_size)), ("nr_inodes", "65536")]
        fresh.append((name, _fs("tmpfs", [*options, ("mode", "0755"), *owner], attrs)))
    homes = []
    if config["home"]:  # none over an image: its own home directories serve, as in the session
        home_options = [("source", config["source"] + "-home"), ("size", str(config["home_size"]))]
        homes.append(
            (config["home"], _fs("tmpfs", [*home_options, ("nr_inodes", "262144"), ("mode", "0700"), *owner], attrs))
        )
    _build_root(config, session_root, root_dir, private_dir, [*fresh, *homes])
    os.close(session_root)
    for _, home in homes:
        os.close(home)
    mounts = [private_dir, *(fd for _, fd in fresh)]
    held = [os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd) for fd in mounts]
    socket.send_fds(sock, [b"ready\n"], held)
    for fd in [*held, *mounts]:
        os.close(fd)
    if sock.recv(16) != b"go\n":
        raise _Refused("the runtime did not say go")
    sock.close()
    # Enter the new root by a mount point the sandbox cannot move: /proc.
    _attach(root_dir, _AT_FDCWD, "/proc")
    os.close(root_dir)
    os.chdir("/proc")  # the command's process makes it its root
    command = os.fork()
    if command == 0:
        try:
            if "confine" in config:
                _become_container_user(config["confine"], filters)
                os.execvpe(config["argv"][0], config["argv"], config["env"])
            _become_sandbox_user(config)
            os.execve(config["program"], config["argv"], config["env"])
        except Exception as exc:  # noqa: BLE001 - as below
            os.write(2, f"private run: {exc}\n".encode())
        os._exit(127)
    while True:  # the reaper of the private pid namespace
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        if pid == command:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _receive_config(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise _Refused("the runtime sent no configuration")
        data += chunk
    config: dict[str, Any] = json.loads(data[8:])
    return config


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    config = _receive_config(sock)
    fds = config["fds"]
    filters = []
    confine = config.get("confine")
    if confine is not None:
        # Nothing of the run outlives the runtime: its pid 1 dies with this process, and this with the runtime.
        _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        if os.getppid() != confine["parent"]:
            raise _Refused("the runtime has exited")
        for path in confine["cgroup_procs"]:  # the host's files: not yet in the container's mounts
            with open(path, "w") as procs:
                procs.write(str(os.getpid()))
        for text in confine["filters"]:
            data = base64.b64decode(text)
            filters.append((_SockFilter * (len(data) // 8)).from_buffer_copy(data))
    for ns in ("net", "uts", "ipc", "cgroup", "mnt"):
        _check(_libc.setns(fds[ns], 0), f"setns {ns}")
    # In the session's mounts from here on: no import may find a module.
    sys.path.clear()
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID), "unshare")
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make the mounts private")
    session_root = os.open("/", _DIR)
    child = os.fork()
    if child == 0:
        try:
            _pid1(config, sock, session_root, filters)
        except Exception as exc:  # noqa: BLE001 - a script's last word: one line, never a traceback
            os.write(2, f"private run: {exc}\n".encode())
        os._exit(125)
    sock.close()
    os.close(session_root)
    _pid, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - as in _pid1
        os.write(2, f"private run: {exc}\n".encode())
        os._exit(125)
