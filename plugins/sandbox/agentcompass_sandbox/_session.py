"""One open ``sandbox`` session: a bubblewrap process tree in its own namespaces.

The session's first process is ``bwrap``, started by the runtime's spawner
process (:mod:`._zygote`) as the host's ``nobody``, already in the session's
cgroup: uid 1000 inside a new user namespace, with new mount, pid, ipc, uts
and cgroup namespaces and ``--die-with-parent`` (its parent is the
spawner, which exits with the runtime), inside a network namespace lent
by the runtime's pool (:mod:`._pool`) until ``close``, whose rules for the
opening policy are in place before bwrap starts. Its init is a shell that says it is
up and then waits on a pipe only the runtime holds, so it also ends when the
session closes or the runtime dies. Every ``exec`` enters those namespaces
with ``nsenter``, so processes an exec leaves in the background live on
until ``close``, as in a container. Each process tree (the init, each exec)
is placed in a leaf of the session's cgroup before it starts, which is how a
timeout, a cancellation or ``close`` kills a whole tree, daemons included.
"""

from __future__ import annotations

import itertools
import math
import os
import posixpath
import select
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from agentcompass import EnvironmentSession, ExecResult, IssueError, NetworkPolicy, netpolicy
from agentcompass.runtime import OutputTail, cleanup_deadline, read_beneath, write_beneath

from . import _host, _netlink, _pool, _spawner
from ._images import UID_BASE, ImageRoot, hold
from ._rootfs import ID_COUNT

#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124
#: ``exit_code`` of an exec after the session's init has exited (nothing ran).
INIT_GONE_EXIT_CODE = 255
_CHUNK = 65536
# After the command exits, how long to keep reading output a background process may hold.
_DRAIN_SECONDS = 0.5
# Puts the process into the cgroups named before "--", then becomes the command.
_WRAP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# The sandbox's init: says it is up, then holds until the runtime closes its
# stdin (close(), or the runtime's exit).
_INIT = "echo ready; read _"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The whole environment of every process the runtime starts for a session
#: (bwrap and its init, nsenter and its wrapper): the runtime's own
#: environment, which may hold API keys, never reaches a sandbox.
BASE_ENV = {"PATH": _PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
#: The namespaces an exec enters, as nsenter names them.
_NAMESPACES = (("user", "user"), ("mnt", "mount"), ("pid", "pid"), ("uts", "uts"), ("ipc", "ipc"),
               ("net", "net"), ("cgroup", "cgroup"))  # fmt: skip
_NAMESPACE_NAMES = tuple(ns for ns, _ in _NAMESPACES)


def fail(message: str) -> IssueError:
    return IssueError("fatal", "environment_failed", message)


_root_binds_cache: list[str] | None = None


def _root_binds() -> list[str]:
    """bwrap arguments mounting the host's userland read-only (blocking: reads /
    once per process; the layout of / does not change under a running runtime)."""
    global _root_binds_cache
    if _root_binds_cache is not None:
        return list(_root_binds_cache)
    args: list[str] = []
    for entry in _host.USERLAND:
        path = "/" + entry
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    _root_binds_cache = args
    return list(args)


class SandboxSession(EnvironmentSession):
    """One open sandbox. File paths: absolute under ``/app``, ``/tests``,
    ``/logs`` or ``/solution``, or relative to ``/app``; they are read and
    written from the host side, walking from the session's directory
    without following any link (:func:`agentcompass.runtime.read_beneath`).
    Every operation after :meth:`close` raises FATAL ``environment_failed``."""

    def __init__(
        self,
        name: str,
        max_output_bytes: int,
        memory_mb: int | None,
        pids_max: int | None,
        lookup: Callable[[str], list[str]] = netpolicy.lookup,
        pool: _pool.Pool | None = None,
        recycle: bool = True,
        tmpfs_mb: int = 1024,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: ImageRoot | None = None,
        user: tuple[int, int] | None = None,
        workdir: str | None = None,
    ):
        self.name = name
        # Over an image: its root (the overlay's lower layer), the ids commands
        # run as inside, and where they start; the image's ENV under the plan's.
        self._image = image
        self._image_lock: int | None = None  # the root's lock, held shared while the session runs
        self._root: str | None = None  # the overlay, on the host
        self._sysfs: str | None = None  # the /sys of its network namespace, on the host
        self._user = user if user is not None else (image.uid, image.gid) if image is not None else None
        self._workdir = workdir or (image.workdir if image is not None else None) or "/"
        self._pool = pool  # where the network namespace comes from (None: bwrap makes one)
        self._recycle = recycle  # give the namespace back at close (False: destroy it)
        self._netns: _pool.Netns | None = None
        self._ruleset_applied = False  # whether any policy installed rules (recycling resets them)
        self._lookup = lookup
        self._dir = _host.session_dir(name)
        self._files = _host.files_dir(name)
        self._max_output = max_output_bytes
        self._memory_mb = memory_mb
        self._pids_max = pids_max
        self._cpus = cpus
        self._env = {**(image.env if image is not None else {}), **(env or {})}  # every command gets it
        self._tmpfs_bytes = tmpfs_mb * 1024 * 1024  # /tmp, and the session's files
        self._cgroups: dict[str, str] = {}
        self._lifeline: int | None = None  # write end of the init's stdin
        self._init_pid: int | None = None  # host pid of bwrap's pid 1, valid only while start runs
        # A pidfd of bwrap's pid 1, held from start to close: it never refers to
        # another process, so an exec never enters a later holder of the number.
        self._pidfd: int | None = None
        self._own_netns: int | None = None  # its network namespace, when not a pooled one
        self._lease: int | None = None
        self._ruleset = False  # whether an nftables table is installed in the namespace
        self._hosts_extended = False  # whether /etc/hosts holds allowlisted names
        self._policy: NetworkPolicy | None = None
        # Over an image under none: the namespace holding eth0 meanwhile (see _park).
        self._parking: int | None = None
        self._parked = False
        self._labels = itertools.count()
        self._closed = False
        self._destroyed = False

    @property
    def handle(self) -> dict[str, Any]:
        return {"name": self.name, "dir": str(self._dir)}

    @property
    def image(self) -> ImageRoot | None:
        """The image root the session runs over (``None``: the host's userland)."""
        return self._image

    @property
    def policy(self) -> NetworkPolicy | None:
        """The policy in force (``None`` before the first one is applied)."""
        return self._policy

    # ------------------------------------------------------------ start

    async def start(self, policy: NetworkPolicy) -> None:
        """Create everything; the caller closes the session if this raises."""
        try:
            init_cg, binds, own_hosts, log_fd = await trio.to_thread.run_sync(self._prepare)
        except _host.SessionExists as exc:
            self._closed = self._destroyed = True  # close() must not touch the other session
            raise fail(str(exc)) from None
        except (OSError, _host.HostError) as exc:
            raise fail(f"sandbox {self.name}: {exc}") from None
        if self._netns is None:
            await self._spawn_init(init_cg, binds, own_hosts, log_fd)
            await self.set_network_policy(policy)
            return
        # The namespace exists already: its rules go in before anything runs there.
        try:
            await self.set_network_policy(policy)
        except BaseException:
            os.close(log_fd)
            raise
        await self._spawn_init(init_cg, binds, own_hosts, log_fd)

    def _prepare(self) -> tuple[str, list[str], bool, int]:
        """Blocking, in one worker-thread hop: the state directory, the
        cgroups, the init's leaf, the binds, whether the session has its own
        /etc/hosts, and bwrap's log file (a descriptor the caller closes)."""
        if self._image is None:
            _host.make_session_dir(self.name, self._tmpfs_bytes)
        else:
            # The files tmpfs only carries exposed directories; the session's writes go to the overlay.
            _host.make_session_dir(self.name, 1 << 20)
            self._image_lock = hold(self._image)
            self._root = _host.make_image_root(self.name, self._image.rootfs, self._tmpfs_bytes, UID_BASE)
            uid, gid = self.inside_ids()
            _host.make_harbor_dirs(self._root, UID_BASE + uid, UID_BASE + gid)
        self._cgroups = _host.make_cgroups(self.name, self._memory_mb, self._pids_max, self._cpus)
        if self._pool is not None:
            self._netns = self._pool.take()
            self._lease = self._netns.lease
        if self._image is not None and self._netns is not None:
            self._sysfs = _host.mount_sysfs(self.name, self._netns.fd)
        init_cg = _host.exec_cgroup(self._cgroups["track"], "init")
        own_hosts = (self._dir / "hosts").exists()
        log_fd = os.open(self._dir / "bwrap.log", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return init_cg, _root_binds() if self._image is None else [], own_hosts, log_fd

    def _procs_files(self, track_leaf: str) -> list[str]:
        files = [os.path.join(track_leaf, "cgroup.procs")]
        for role in ("memory", "pids", "cpu"):
            path = self._cgroups.get(role)
            if path is not None and path != self._cgroups["track"]:
                files.append(os.path.join(path, "cgroup.procs"))
        return files

    def _image_argv(self, own_hosts: bool, share: list[str]) -> list[str]:
        """bwrap over the image's overlay: root inside with every capability
        of its own user namespace, whose 65536 ids the spawner maps to the
        images' unprivileged host range (bwrap waits for that on fd 4)."""
        assert self._root is not None
        mounts = ["--bind", self._root, "/", "--proc", "/proc", "--dev", "/dev"]
        if self._sysfs is not None:
            mounts += ["--ro-bind", self._sysfs, "/sys"]
        if own_hosts:
            mounts += ["--ro-bind", str(self._dir / "hosts"), "/etc/hosts"]
        if os.path.isfile("/etc/resolv.conf") and not os.path.islink("/etc/resolv.conf"):
            mounts += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        mounts += ["--ro-bind", str(self._files / _host.EXPOSED), _host.EXPOSED_INSIDE]
        return [
            "bwrap", "--die-with-parent", "--unshare-all", "--unshare-user", *share, "--userns-block-fd", "4",
            "--cap-add", "ALL", "--uid", "0", "--gid", "0", "--hostname", "sandbox", *mounts,
            # One wait on fd 4 (bwrap closes it after): for the maps, which the
            # spawner writes once bwrap and its child are in their cgroups.
            "--chdir", "/", "--info-fd", "3", "--", "sh", "-c", _INIT,
        ]  # fmt: skip

    async def _spawn_init(self, init_cg: str, binds: list[str], own_hosts: bool, log_fd: int) -> None:
        mounts: list[str] = []
        for sub in _host.SUBDIRS:
            mounts += ["--bind", str(self._files / sub), "/" + sub]
        if own_hosts:
            mounts += ["--ro-bind", str(self._dir / "hosts"), "/etc/hosts"]
        # Where expose_directory's binds arrive while the sandbox runs.
        mounts += ["--ro-bind", str(self._files / _host.EXPOSED), _host.EXPOSED_INSIDE]
        # A pooled namespace is entered by the spawner; otherwise bwrap makes one (loopback only).
        share = [] if self._netns is None else ["--share-net"]
        argv = [
            "bwrap", "--die-with-parent", "--unshare-all", *share, "--uid", str(_host.INSIDE_UID),
            "--gid", str(_host.INSIDE_UID), "--hostname", "sandbox", *binds,
            "--proc", "/proc", "--dev", "/dev", "--size", str(self._tmpfs_bytes), "--tmpfs", "/tmp", "--dir", "/run", *mounts,
            # The root tmpfs is the sandbox user's: read-only, so no command can
            # replace /lib64 (every later program's ELF interpreter) or /bin.
            "--remount-ro", "/",
            "--chdir", "/app", "--info-fd", "3", "--block-fd", "4", "--", "sh", "-c", _INIT,
        ]  # fmt: skip
        if self._image is not None:
            argv = self._image_argv(own_hosts, share)
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        out_read, out_write = os.pipe()
        # The init's stdin: the runtime holds the write end until close().
        keep_read, self._lifeline = os.pipe()
        try:
            _, child_pid = await _spawner.spawn(
                argv,
                [keep_read, out_write, log_fd, info_write, block_read, info_read, block_write],
                self._procs_files(init_cg),
                None if self._netns is None else self._netns.fd,
                BASE_ENV,
                uid=_host.HOST_UID if self._image is None else UID_BASE,
                idmap=None if self._image is None else (0, UID_BASE, ID_COUNT),
            )
        except BaseException as exc:
            os.close(out_read)
            if isinstance(exc, _host.HostError):
                raise fail(f"sandbox {self.name}: {exc} ({await self._log()})") from None
            raise
        # bwrap's pid 1 in the sandbox may still be moving into the final user
        # namespace; the init prints once everything is set up.
        ready = b""
        async with trio.lowlevel.FdStream(out_read) as stdout:
            while b"\n" not in ready and (chunk := await stdout.receive_some(64)):
                ready += chunk
        if ready != b"ready\n":
            raise fail(f"sandbox {self.name}: bwrap did not start its init ({ready!r}): {await self._log()}")
        # bwrap's pid 1 in the sandbox (the init's parent) is past its setup
        # once the init runs: every exec enters its namespaces, held from now on.
        self._init_pid = child_pid
        try:
            self._pidfd = os.pidfd_open(child_pid)
            if self._netns is None:
                self._own_netns = self.namespace_fds(("net",))["net"]
        except (OSError, InitGone) as exc:
            raise fail(f"sandbox {self.name}: its init ended while it started ({exc})") from None

    async def _log(self) -> str:
        """bwrap's error output, on one line."""
        try:
            log_text = await trio.Path(self._dir / "bwrap.log").read_text(errors="replace")
        except OSError as exc:
            return f"no bwrap log: {exc}"
        return " ".join(log_text.split())[:300]

    # ------------------------------------------------------------ exec

    def _check_open(self) -> None:
        if self._closed:
            raise fail(f"sandbox {self.name} is closed")

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (``bash -c cmd``, or an argv list) inside the sandbox as uid 1000.

        ``cwd`` defaults to ``/app``; a relative ``cwd`` is relative to
        ``/app``. The environment is fresh: ``PATH``, ``HOME=/tmp``,
        ``LANG=C.UTF-8``, ``APP_DIR=/app``, ``TESTS_DIR=/tests``,
        ``LOGS_DIR=/logs``, ``SOLUTION_DIR=/solution``, then ``env``.
        Output keeps each stream's tail, at most ``max_output_bytes``, with a
        ``[... N earlier bytes dropped ...]`` line when truncated. At
        ``timeout`` the exec's whole process tree is killed (``timed_out=True``,
        ``exit_code=124``); a cancellation kills it too and propagates.
        Processes the command leaves in the background keep running until
        :meth:`close`; the call does not wait for them.
        """
        self._check_open()
        label = f"x{next(self._labels)}"
        try:
            fds, leaf = await trio.to_thread.run_sync(self._exec_prepare, label)
        except OSError as exc:
            raise fail(f"sandbox {self.name}: {exc}") from None
        except InitGone as exc:
            # The agent killed its own init: nothing runs any more, which is its doing.
            return ExecResult(exit_code=INIT_GONE_EXIT_CODE, stderr=f"sandbox {self.name}: {exc}; nothing ran\n")
        uid, gid = self.inside_ids()
        full = [
            "/bin/sh", "-c", _WRAP, "sh", *self._procs_files(leaf), "--",
            *nsenter_args(fds), "-S", str(uid), "-G", str(gid), *self.command_line(cmd, cwd, env),
        ]  # fmt: skip
        try:
            self._check_open()
            proc = await trio.lowlevel.open_process(
                full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=BASE_ENV,
                pass_fds=tuple(fds.values()),
            )
        except OSError as exc:
            await trio.to_thread.run_sync(_host.try_remove_cgroup, leaf)
            raise fail(f"sandbox {self.name}: could not start nsenter: {exc}") from None
        except BaseException:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await trio.to_thread.run_sync(_host.try_remove_cgroup, leaf)
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
        try:
            return await supervise(proc, leaf, self._max_output, timeout)
        finally:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await trio.to_thread.run_sync(_host.try_remove_cgroup, leaf)

    async def exec_private(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        directory: str,
        max_bytes: int,
        inputs: Mapping[str, bytes] | None = None,
    ) -> tuple[ExecResult, dict[str, bytes]]:
        """Run ``cmd`` as :meth:`exec` does, with ``directory`` (a Harbor
        directory or a path under one) private to it, the Harbor directories
        ``inputs`` name holding only them, and a fresh ``HOME``; return its
        result and the regular files it left in ``directory``; how, and what
        it costs, is in :mod:`._private`."""
        from . import _private  # it builds on this module

        return await _private.exec_private(
            self, cmd, timeout, cwd, env, directory=directory, max_bytes=max_bytes, inputs=inputs
        )

    def inside_ids(self) -> tuple[int, int]:
        """The uid and gid commands run as inside the session."""
        return self._user if self._user is not None else (_host.INSIDE_UID, _host.INSIDE_UID)

    def command_line(self, cmd: str | list[str], cwd: str | None, env: Mapping[str, str] | None) -> list[str]:
        """What nsenter runs for ``cmd``: :func:`command_line`, or over an
        image its own ``env -i -C`` (where that is coreutils'; else its ``sh``
        going there first) to ``cwd`` under the image's working directory,
        with the image's environment, the plan's, then ``env``."""
        if self._image is None:
            return command_line(cmd, cwd, {**self._env, **(env or {})})
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
        home = "/root" if self.inside_ids()[0] == 0 else "/"
        variables = {**BASE_ENV, "HOME": home, **self._env, **(env or {})}
        workdir = posixpath.normpath(str(PurePosixPath(self._workdir) / (cwd or ".")))
        if self._image.env_chdir:
            return ["/usr/bin/env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in variables.items()), *argv]
        return [
            "/bin/sh", "-c", 'cd -- "$0" || exit 126; exec env -i "$@"', workdir,
            *(f"{k}={v}" for k, v in variables.items()), *argv,
        ]  # fmt: skip

    def namespace_fds(self, which: tuple[str, ...] = _NAMESPACE_NAMES) -> dict[str, int]:
        """Blocking: new descriptors of the init's namespaces ``which`` (the
        caller closes them), opened while the session's pidfd shows the init
        alive throughout, so they are its own and never a later holder's of
        its pid number. Raise :class:`InitGone` once the init has exited."""
        if self._pidfd is None or self._init_pid is None:
            raise InitGone("the sandbox has not started")
        fds: dict[str, int] = {}
        try:
            for ns in which:
                try:
                    fds[ns] = os.open(f"/proc/{self._init_pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise InitGone("the session's init has exited") from None
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if poller.poll(0):  # readable: it has exited, the numbers may be anyone's
                raise InitGone("the session's init has exited")
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        return fds

    def _exec_prepare(self, label: str) -> tuple[dict[str, int], str]:
        """Blocking, one thread hop per exec: the namespaces, then the cgroup leaf."""
        fds = self.namespace_fds()
        try:
            return fds, _host.exec_cgroup(self._cgroups["track"], label)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise

    # ------------------------------------------------------------ files

    def _locate(self, path: str | os.PathLike[str]) -> tuple[Path, str]:
        """(host directory, path beneath it) of a sandbox path, refused when it
        names a place outside the Harbor directories (over an image: any
        path of its root, relative ones under its working directory). Only
        lexical: the session's links are dealt with by opening, never by resolving."""
        if self._root is not None:
            raw = posixpath.normpath(str(PurePosixPath(self._workdir) / os.fspath(path)))
            return Path(self._root), raw.lstrip("/") or "."
        raw = posixpath.normpath(str(PurePosixPath("/app") / os.fspath(path)))
        parts = raw.split("/")[1:]
        if not parts or parts[0] not in _host.SUBDIRS:
            raise fail(f"path {os.fspath(path)!r} is outside the sandbox's /app, /tests, /logs and /solution")
        return self._files / parts[0], "/".join(parts[1:]) or "."

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file of at most ``max_bytes`` (path rules in the
        class docstring); a link on the way, a FIFO, a device or a longer
        file raises :class:`~agentcompass.FileRefusedError` without blocking."""
        self._check_open()
        root, relpath = self._locate(path)
        return await trio.to_thread.run_sync(read_beneath, root, relpath, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Replace a file, creating parent directories; what it makes belongs
        to the sandbox user. A link on the way is refused, never followed."""
        self._check_open()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        root, relpath = self._locate(path)
        owner = (_host.HOST_UID, _host.HOST_UID)
        if self._image is not None:
            uid, gid = self.inside_ids()
            owner = (UID_BASE + uid, UID_BASE + gid)
        await trio.to_thread.run_sync(write_beneath, root, relpath, payload, owner)

    async def expose_directory(self, host_path: str) -> str:
        """Bind ``host_path`` read-only (and ``nosuid``, ``nodev``) into the
        running sandbox at ``/run/agentcompass/<n>`` and return that path;
        how the bind reaches a running sandbox is :func:`._host.expose`.
        The bind goes with the session (``close``, ``reap`` and ``sweep``
        detach it; the host directory is never deleted)."""
        self._check_open()
        label = f"d{next(self._labels)}"
        try:
            return await trio.to_thread.run_sync(_host.expose, self.name, os.fspath(host_path), label)
        except (OSError, _host.HostError) as exc:
            raise fail(f"sandbox {self.name}: could not expose {host_path}: {exc}") from None

    # ------------------------------------------------------------ network

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the policy live; processes keep running and the new rules
        apply to their next packet (a connection the new policy forbids stops
        working). ``allowlist`` names are resolved now, on the host."""
        self._check_open()
        try:
            if policy.mode not in ("none", "allowlist", "full"):
                raise ValueError(f"unknown network policy {policy.mode!r}")
            resolved: list[netpolicy.Resolved] = []
            if policy.mode == "allowlist":
                resolved = await trio.to_thread.run_sync(netpolicy.resolve, tuple(policy.allow), self._lookup)
            if resolved or self._hosts_extended:
                await trio.to_thread.run_sync(self._write_hosts, resolved)
                self._hosts_extended = any(r.name is not None for r in resolved)
            # Restrict before connecting: rules go in before a veth is made, so a
            # failure part-way never leaves the sandbox with more access than asked.
            if policy.mode != "full" and (policy.mode == "allowlist" or self._lease is not None or self._ruleset):
                self._ruleset_applied = True
                await trio.to_thread.run_sync(self._apply_ruleset, netpolicy.ruleset(policy.mode, resolved))
                self._ruleset = True
            if policy.mode != "none" and self._lease is None:
                # A pooled namespace without a veth is lent under none only.
                await trio.to_thread.run_sync(self._make_network, self._net_fd())
            if policy.mode == "full" and self._ruleset:
                await trio.to_thread.run_sync(self._apply_ruleset, netpolicy.ruleset("full"))
                self._ruleset = False
            if self._image is not None and self._lease is not None and (policy.mode == "none") != self._parked:
                await trio.to_thread.run_sync(self._park if policy.mode == "none" else self._unpark)
        except (OSError, ValueError, _host.HostError) as exc:
            raise fail(f"sandbox {self.name}: could not apply network policy {policy.mode!r}: {exc}") from None
        self._policy = policy

    def _park(self) -> None:
        """Blocking: under ``none``, an image session sees loopback only, as in
        a container without a network: its ``eth0`` waits in a namespace of
        its own (made once) until a policy with egress brings it back. The
        rules of ``none`` are in place first, so nothing leaves meanwhile."""
        if self._parking is None:
            self._parking, probe = _netlink.make_namespace()
            probe.close()
        _netlink.move_link(self._net_fd(), "eth0", self._parking)
        self._parked = True

    def _unpark(self) -> None:
        """Blocking: ``eth0`` back in the session's namespace, configured as it was made."""
        assert self._parking is not None and self._lease is not None
        _netlink.move_link(self._parking, "eth0", self._net_fd())
        self._parked = False
        host_ip, sandbox_ip = _host.lease_addresses(self._lease)
        _netlink.configure_inside(self._net_fd(), sandbox_ip, host_ip)

    def _apply_ruleset(self, ruleset: str) -> None:
        """Blocking: ``nft -f`` in the session's network namespace (a pooled
        one through its descriptor, so even before the sandbox starts)."""
        _host.apply_ruleset_in(self._net_fd(), ruleset)

    def _net_fd(self) -> int:
        """The session's network namespace: the pool's, or its init's own."""
        fd = self._own_netns if self._netns is None else self._netns.fd
        if fd is None:
            raise _host.HostError("the sandbox has no network namespace (it has not started)")
        return fd

    def _write_hosts(self, resolved: list[netpolicy.Resolved]) -> None:
        """Blocking: rewrite the sandbox's /etc/hosts in place (it is bind-mounted by inode)."""
        path = self._dir / "hosts"
        if not path.exists():
            return
        text = netpolicy.hosts_file(_host.host_hosts(), resolved)
        with open(path, "r+") as f:
            if f.read() != text:
                f.seek(0)
                f.write(text)
                f.truncate()

    def _make_network(self, netns_fd: int) -> None:
        """Blocking: lease a subnet (recorded in the marker first, so teardown
        finds it) and make the veth."""
        marker = {**_host.read_marker(self.name), "network": True}
        _host.write_marker(self.name, marker)  # before the lease: teardown then looks for it by name
        lease = _host.acquire_lease(self.name)
        self._lease = lease
        _host.write_marker(self.name, {**marker, "lease": lease})
        _host.make_veth(self.name, netns_fd, lease)

    @property
    def addresses(self) -> tuple[str, str] | None:
        """(host end, sandbox end) IPv4 addresses of the veth, once one exists."""
        return None if self._lease is None else _host.lease_addresses(self._lease)

    # ------------------------------------------------------------ close

    async def close(self) -> None:
        """Kill every process of the sandbox and remove its cgroups, veth,
        NAT table, lease and directory. Idempotent; an interrupted close is
        finished by calling it again (or by ``reap`` / ``sweep``)."""
        self._closed = True
        if self._destroyed:
            return
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        for fd in (self._pidfd, self._own_netns):
            if fd is not None:
                os.close(fd)
        self._pidfd = self._own_netns = None
        if self._parking is not None:
            # A pooled namespace whose eth0 is parked fails its recycling check: it is destroyed.
            os.close(self._parking)
            self._parking = None
        if self._image_lock is not None:
            os.close(self._image_lock)
            self._image_lock = None
        # bwrap is in the session's cgroup from its first instruction, so the
        # teardown kills it with everything it started.
        await trio.to_thread.run_sync(self._destroy)
        self._destroyed = True

    def _destroy(self) -> None:
        """Blocking: the teardown, then the pooled namespace goes back (or,
        if the teardown failed, is destroyed: something may still run in it)."""
        netns = self._netns
        try:
            _host.destroy(self.name)
        except BaseException:
            if netns is not None and self._pool is not None:
                self._netns = None
                self._pool.discard(netns)
            raise
        if netns is not None and self._pool is not None:
            self._netns = None
            if self._recycle:
                self._pool.give_back(netns, self._ruleset_applied)
            else:
                self._pool.discard(netns)


async def supervise(
    proc: trio.Process,
    leaf: str,
    max_output: int,
    timeout: float | None,
    first: Callable[[], Awaitable[None]] | None = None,
) -> ExecResult:
    """Keep the tails of ``proc``'s output until it exits and return its
    result. ``timeout`` (from now, ``first`` included: what to do with the
    running process before waiting for it) kills the whole tree in the
    cgroup ``leaf`` and gives ``timed_out``; any other way out kills it too,
    shielded until the grace deadline, and propagates."""
    out, err = OutputTail(max_output), OutputTail(max_output)
    timed_out = False
    try:
        async with trio.open_nursery() as nursery:
            out_done, err_done = trio.Event(), trio.Event()
            nursery.start_soon(_pump, proc.stdout, out, out_done)
            nursery.start_soon(_pump, proc.stderr, err, err_done)
            with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                if first is not None:
                    await first()
                await proc.wait()
            if deadline.cancelled_caught:
                timed_out = True
                await trio.to_thread.run_sync(_host.kill_cgroup, leaf, False)
                await proc.wait()
            with trio.move_on_after(_DRAIN_SECONDS):
                await out_done.wait()
                await err_done.wait()
            nursery.cancel_scope.cancel()
    except BaseException:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await trio.to_thread.run_sync(_host.kill_cgroup, leaf, False)
            await proc.wait()
        raise
    finally:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()
    code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
    assert code is not None
    return ExecResult(exit_code=code, stdout=out.text(), stderr=err.text(), timed_out=timed_out)


async def _pump(stream: trio.abc.ReceiveStream | None, buffer: OutputTail, done: trio.Event) -> None:
    assert stream is not None
    while chunk := await stream.receive_some(_CHUNK):
        buffer.append(chunk)
    done.set()


def command_line(cmd: str | list[str], cwd: str | None, env: Mapping[str, str] | None, home: str = "/tmp") -> list[str]:
    """``env -i -C WORKDIR VAR=... COMMAND``: ``cmd`` (``bash -c`` for a string)
    in ``cwd`` under ``/app``, with the session's fresh environment, then ``env``."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
    variables = {
        **BASE_ENV,
        "HOME": home,
        "APP_DIR": "/app",
        "TESTS_DIR": "/tests",
        "LOGS_DIR": "/logs",
        "SOLUTION_DIR": "/solution",
        **(env or {}),
    }
    workdir = str(PurePosixPath("/app") / (cwd or "."))
    return ["env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in variables.items()), *argv]


class InitGone(Exception):
    """The session's init has exited: its namespaces can no longer be entered."""


def nsenter_args(fds: dict[str, int]) -> list[str]:
    """``nsenter`` and its namespace options, by the descriptors of
    :meth:`SandboxSession.namespace_fds` (pass them with ``pass_fds``), never by pid."""
    return ["nsenter", *(f"--{option}=/proc/self/fd/{fds[ns]}" for ns, option in _NAMESPACES if ns in fds)]
