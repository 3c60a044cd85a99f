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
import os
import posixpath
import select
import subprocess
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

import trio

from agentcompass import EnvironmentSession, ExecResult, NetworkPolicy, netpolicy
from agentcompass.host import FileLock
from agentcompass.runtime import cleanup_deadline

from . import _host, _pool, _private, _spawner
from ._exec import (
    BASE_ENV,
    INIT,
    INIT_GONE_EXIT_CODE,
    NAMESPACE_NAMES,
    TIMEOUT_EXIT_CODE,
    WRAP,
    InitGone,
    command_line,
    fail,
    image_bwrap_argv,
    nsenter_args,
    root_binds,
    supervise,
)
from ._files import SessionFiles
from ._images import UID_BASE, ImageRoot, hold
from ._network import SessionNetwork
from ._rootfs import ID_COUNT

__all__ = ["TIMEOUT_EXIT_CODE", "SandboxSession", "fail"]


class SandboxSession(SessionFiles, SessionNetwork, EnvironmentSession):
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
        self._image_lock: FileLock | None = None  # the root's lock, held shared while the session runs
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
        return init_cg, root_binds() if self._image is None else [], own_hosts, log_fd

    def _procs_files(self, track_leaf: str) -> list[str]:
        files = [os.path.join(track_leaf, "cgroup.procs")]
        for role in ("memory", "pids", "cpu"):
            path = self._cgroups.get(role)
            if path is not None and path != self._cgroups["track"]:
                files.append(os.path.join(path, "cgroup.procs"))
        return files

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
            "--chdir", "/app", "--info-fd", "3", "--block-fd", "4", "--", "sh", "-c", INIT,
        ]  # fmt: skip
        if self._image is not None:
            assert self._root is not None
            hosts = str(self._dir / "hosts") if own_hosts else None
            argv = image_bwrap_argv(self._root, self._sysfs, hosts, str(self._files / _host.EXPOSED), share)
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
            "/bin/sh", "-c", WRAP, "sh", *self._procs_files(leaf), "--",
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

    def namespace_fds(self, which: tuple[str, ...] = NAMESPACE_NAMES) -> dict[str, int]:
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
            self._image_lock.release()
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
