"""One open ``docker`` session: a container, its own network, and execs.

The container runs ``sleep infinity`` under Docker's init (``--init``), not
the image's command, so it lives until :meth:`DockerSession.close` and reaps
the orphans commands leave. It is attached to a bridge network of its own
(``full`` and ``allowlist``) or to none (``none``: loopback only); the
policy's rules are nftables rules installed from the host in the container's
network namespace, which its processes cannot change (``NET_ADMIN`` is not
among their capabilities).

Every ``exec`` is an Engine API exec whose output is the daemon's
multiplexed stream (8-byte frame headers), read as a streamed response. The
exec's process is the leader of a session of its own inside the container;
at a timeout or a cancellation the runtime runs, as root inside the same
container, a small ``sh`` that kills that process group and every process
of that session: the command's whole tree, except what moved itself into a
session of its own (a daemon that ``setsid`` itself is the agent's and lives
until ``close``, as with ``sandbox``).
"""

from __future__ import annotations

import io
import itertools
import math
import os
import posixpath
import tarfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import httpx
import trio

from agentcompass import EnvironmentSession, ExecResult, IssueError, NetworkPolicy, netpolicy
from agentcompass.runtime import (
    DEFAULT_MAX_READ_BYTES,
    OutputCallback,
    cleanup_deadline,
    exec_keeping_tails,
)

from . import _expose, _private
from ._api import Engine, EngineError, demultiplex
from ._archive import first_member
from ._container import ContainerSpec, create_failed, storage_unsupported

#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124
#: ``exit_code`` of an exec whose container no longer runs (nothing ran).
CONTAINER_GONE_EXIT_CODE = 255
#: The labels on everything a session is made of.
SESSION_LABEL = "agentcompass.session"
RUN_LABEL = "agentcompass.run"
#: Docker's embedded DNS server: on the container's loopback, forwarding from
#: the daemon outside the rules, so ``none`` and ``allowlist`` refuse it and
#: names do not resolve inside (an allowlisted name is allowed at the
#: addresses it had on the host when the policy was applied).
EMBEDDED_DNS = "127.0.0.11"
# After the command's own process exits, how long output a background process holds is still read.
_DRAIN_SECONDS = 0.5
#: How long a container or network create may take (it is not cut short, see DockerSession._made).
CREATE_SECONDS = 60
# How often a long exec asks whether its own process has exited (a background child may hold the stream).
_POLL_SECONDS = 0.5
# Kills the process group and the session led by pid $1 (stat fields after "comm)": state ppid pgrp session).
_KILL_TREE = (
    'kill -9 -- "-$1" 2>/dev/null; for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) || continue; '
    's=${s##*) }; set -- "$1" $s; [ "$5" = "$1" ] || [ "$6" = "$1" ] && kill -9 "${d#/proc/}" 2>/dev/null; done; '
    "exit 0"
)


def fail(message: str) -> IssueError:
    """FATAL ``environment_failed`` (phase setup) for an open that cannot proceed."""
    return IssueError("fatal", "environment_failed", message, phase="setup")


def run_tag(name: str) -> str:
    """The run's tag in a session name (``ac3f9a1c2b7d-1f`` -> ``ac3f9a1c2b7d``)."""
    head, _, tail = name.rpartition("-")
    return head or name


@attrs.define(eq=False)
class DockerSession(EnvironmentSession):
    """A container of the ``docker`` provider (see the module docstring)."""

    engine: Engine
    name: str
    max_output: int
    lookup: Any
    container: str | None = None
    network: str | None = None
    workdir: str = "/"
    #: The host's address on the session's network (where a process inside reaches the host).
    gateway: str | None = None
    _policy: NetworkPolicy | None = None
    _attached: bool = False
    _creating: bool = False
    #: The host directory bound at ``/run/agentcompass`` (``None``: no exposures).
    exposed: str | None = None
    #: The daemon's reason when it could not limit storage and the container was made without (``None``: it did not say).
    storage_refused: str | None = None
    _state: bool = False  # whether a state directory may exist (close destroys it)
    _labels: Iterator[int] = attrs.Factory(itertools.count)
    _closed: bool = False
    _close_lock: trio.Lock = attrs.Factory(trio.Lock)
    #: The confinement a private run copies, or why there is none (``None``: not started).
    private: _private.Snapshot | str | None = None
    #: Called with the reason each time a private run cannot be made here (the provider says so once).
    on_not_private: Any = None

    @property
    def handle(self) -> dict[str, Any]:
        return {"name": self.name, "container": self.container, "network": self.network}

    @property
    def policy(self) -> NetworkPolicy | None:
        return self._policy

    def labels(self) -> dict[str, str]:
        return {SESSION_LABEL: self.name, RUN_LABEL: run_tag(self.name)}

    # -- opening -----------------------------------------------------------

    async def start(
        self,
        image: str,
        spec: ContainerSpec,
        policy: NetworkPolicy,
        *,
        expose: bool = False,
        storage_optional: bool = False,
    ) -> None:
        """Create the network and the container, apply ``policy``, start it.
        With ``storage_optional``, a daemon that cannot limit storage gets a
        container without the limit (:attr:`storage_refused` says why).

        With ``expose`` (root, and a daemon not known to be remote) the
        container gets the session's ``exposed/`` directory (``_expose``);
        when the daemon cannot bind it (it does not see this host's
        filesystem, or not its mounts) the container is made without, and
        :attr:`exposed` stays ``None``."""
        if expose:
            # Made first: a kill from here on leaves it to reap and sweep, by name.
            self._state = True
            try:
                self.exposed = await trio.to_thread.run_sync(_expose.prepare, self.name)
            except _expose.SessionExists:
                self._state = False  # another session's: not ours to remove
                raise fail(f"docker session {self.name} already has a state directory") from None
            except (OSError, _expose.HostError):
                # No mounts here (a user namespace without CAP_SYS_ADMIN): a session without exposures.
                await trio.to_thread.run_sync(_expose.destroy, self.name)
                self._state = False
        self.network = self.name
        created = await self._made(
            "/networks/create",
            body={"Name": self.network, "Driver": "bridge", "CheckDuplicate": True, "Labels": self.labels()},
        )
        self.network = created["Id"]
        # Until the daemon's answer is heard, close() removes the container by its name.
        self._creating = True
        try:
            try:
                made = await self._create(image, spec)
            except EngineError as exc:
                if self.exposed is None or self.exposed not in exc.message:
                    raise
                # The daemon has no such directory (a remote one) or cannot bind it with propagation.
                await trio.to_thread.run_sync(_expose.destroy, self.name)
                self.exposed = None
                made = await self._create(image, spec)
        except EngineError as exc:
            if not (storage_optional and spec.storage_mb is not None and storage_unsupported(exc)):
                raise create_failed(exc, self.name, spec) from None
            self.storage_refused = " ".join(exc.message.split())[:300]
            made = await self._create(image, attrs.evolve(spec, storage_mb=None))
        self.container = made["Id"]
        self._creating = False
        self._attached = True
        if policy.mode == "none":
            await self._disconnect()
        await self.engine.request("POST", f"/containers/{self.container}/start")
        info = await self.engine.request("GET", f"/containers/{self.container}/json")
        self.workdir = info["Config"].get("WorkingDir") or "/"
        # Before anything of the agent's runs (see _private).
        self.private = await trio.to_thread.run_sync(_private.snapshot_or_reason, self.container, info)
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        self.gateway = next((n.get("Gateway") for n in networks.values() if n.get("Gateway")), None)
        if policy.mode == "full":
            self._policy = policy  # a new network namespace has no rules to remove
        else:
            # Only the init (sleep) has run so far: nothing has used the network yet.
            await self._apply(policy)

    async def _create(self, image: str, spec: ContainerSpec) -> Any:
        body = spec.create_body(image, self.labels(), self.name, self.exposed)
        return await self._made("/containers/create", params={"name": self.name}, body=body)

    async def _made(self, path: str, **request: Any) -> Any:
        """A create request, waited for to its answer even when cancelled
        meanwhile (up to :data:`CREATE_SECONDS`; the cancellation then takes
        effect at the next checkpoint, with the new object's id known): cut
        short, the daemon can still make the object after close's delete by
        name found nothing there, and nothing would remove it."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CREATE_SECONDS) as scope:
            return await self.engine.request("POST", path, **request)
        assert scope.cancelled_caught
        raise fail(f"docker session {self.name}: the daemon did not answer POST {path} within {CREATE_SECONDS}s")

    # -- exec --------------------------------------------------------------

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (``bash -c cmd``, or an argv list) in the container.

        As the image's user (or the plan's ``user``), in its working
        directory (or the plan's ``workdir``; a relative ``cwd`` is relative
        to it), with the container's environment (the image's and the plan's)
        plus ``env``. Each stream keeps its tail, at most ``max_output_bytes``,
        with a ``[... N earlier bytes dropped ...]`` line when truncated. At
        ``timeout`` the command's tree is killed (``timed_out=True``,
        ``exit_code=124``); a cancellation kills it too and propagates.
        Processes the command leaves in the background keep running until
        :meth:`close`; the call does not wait for them.
        """
        return await exec_keeping_tails(self.exec_stream, self.max_output, cmd, timeout, cwd, env)

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        """:meth:`exec`, handing the output to ``on_output`` as the daemon sends it."""
        container = self._check_open()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
        body: dict[str, Any] = {
            "AttachStdin": False,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": argv,
            "Env": [f"{k}={v}" for k, v in (env or {}).items()],
            "WorkingDir": self._path(cwd or "."),
        }
        try:
            made = await self.engine.request("POST", f"/containers/{container}/exec", body=body)
        except EngineError as exc:
            if exc.status in (404, 409):
                # The container is gone or stopped: nothing runs any more.
                return ExecResult(exit_code=CONTAINER_GONE_EXIT_CODE, stderr=f"docker session {self.name}: {exc}\n")
            raise
        exec_id = made["Id"]
        timed_out = False
        info: dict[str, Any] = {}
        try:
            with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
                info = await self._run(exec_id, on_output)
            if deadline.cancelled_caught:
                timed_out = True
                with trio.move_on_at(cleanup_deadline(), shield=True):
                    await self._kill_tree(container, exec_id)
        except BaseException:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await self._kill_tree(container, exec_id)
            raise
        if timed_out:
            return ExecResult(exit_code=TIMEOUT_EXIT_CODE, timed_out=True)
        code = info.get("ExitCode")
        return ExecResult(exit_code=code if isinstance(code, int) else CONTAINER_GONE_EXIT_CODE)

    async def _run(self, exec_id: str, on_output: OutputCallback) -> dict[str, Any]:
        """Read the exec's frames until the stream ends, or until a little
        after its own process exited (a background child may hold the stream)."""
        body = {"Detach": False, "Tty": False}
        async with self.engine.stream("POST", f"/exec/{exec_id}/start", body=body) as response:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_exit, exec_id, nursery.cancel_scope)
                await demultiplex(response, on_output)
                nursery.cancel_scope.cancel()
        # The stream can end before the process does (it closed its output).
        pause = 0.005
        while (info := await self.engine.request("GET", f"/exec/{exec_id}/json")).get("Running"):
            await trio.sleep(pause)
            pause = min(pause * 2, _POLL_SECONDS)
        return info

    async def _watch_exit(self, exec_id: str, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(_POLL_SECONDS)
            info = await self.engine.request("GET", f"/exec/{exec_id}/json")
            if not info.get("Running"):
                await trio.sleep(_DRAIN_SECONDS)
                scope.cancel()
                return

    async def _kill_tree(self, container: str, exec_id: str) -> None:
        """Kill the exec's process group and session inside the container (see the module docstring)."""
        try:
            info = await self.engine.request("GET", f"/exec/{exec_id}/json")
            host_pid = info.get("Pid") or 0
            if not info.get("Running") or host_pid <= 0:
                return
            inside = await trio.to_thread.run_sync(_namespace_pid, host_pid)
            if inside is None:
                return
            killer = await self.engine.request(
                "POST",
                f"/containers/{container}/exec",
                body={
                    "Cmd": ["/bin/sh", "-c", _KILL_TREE, "sh", str(inside)],
                    "User": "0",
                    "Tty": False,
                    "AttachStdout": True,
                    "AttachStderr": True,
                },
            )
            # Attached, so the tree is gone when its output ends (it prints nothing).
            start = f"/exec/{killer['Id']}/start"
            async with self.engine.stream("POST", start, body={"Detach": False, "Tty": False}) as response:
                async for _ in response.aiter_raw():
                    pass
        except (EngineError, httpx.HTTPError):
            pass  # the container is gone, and the tree with it

    # -- files -------------------------------------------------------------

    def _path(self, path: str) -> str:
        """An absolute path in the container: relative ones are under the working directory."""
        return posixpath.normpath(posixpath.join(self.workdir, os.fspath(path)))

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of the regular file at ``path`` (relative: under the
        working directory), at most ``max_bytes``.

        Read through the daemon's archive endpoint, which resolves the path
        inside the container's root: a link as the last component comes back
        as a link and is refused, as is anything but a regular file or a file
        longer than ``max_bytes`` (:class:`FileRefusedError`); only the
        header and the file's bytes are read, so a FIFO or a huge file never
        blocks or fills memory."""
        container = self._check_open()
        limit = DEFAULT_MAX_READ_BYTES if max_bytes is None else max_bytes
        target = self._path(path)
        try:
            async with self.engine.stream(
                "GET", f"/containers/{container}/archive", params={"path": target}
            ) as response:
                return await first_member(response, target, limit)
        except EngineError as exc:
            if exc.status == 404:
                raise FileNotFoundError(f"{path}: no such file in docker session {self.name}") from None
            raise

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` to ``path`` (relative: under the working directory),
        creating parent directories, replacing whatever is there (a link is
        replaced, never followed out: the daemon resolves paths in the
        container's root). The file is root's, mode 0644."""
        container = self._check_open()
        raw = data.encode() if isinstance(data, str) else bytes(data)
        target = self._path(path)
        if target == "/":
            raise IsADirectoryError(f"{path}: is the container's root")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            # No entries for the parents: the daemon makes missing ones (0755,
            # root's) and an entry would reset an existing one's mode (/tmp's).
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size, info.mode, info.mtime = len(raw), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(raw))
        await self.engine.request(
            "PUT",
            f"/containers/{container}/archive",
            params={"path": "/", "noOverwriteDirNonDir": True},
            content=buffer.getvalue(),
            headers={"Content-Type": "application/x-tar"},
        )

    # -- host directories --------------------------------------------------

    async def expose_directory(self, host_path: str) -> str:
        """Bind ``host_path`` read-only (``nosuid``, ``nodev``) into the
        running container at ``/run/agentcompass/<n>`` and return that path.

        The bind is made on the host under the session's ``exposed/``, whose
        mount propagates into the container (``_expose``), so nothing is
        copied however large the directory. It needs root and a daemon on
        this host that sees its mounts; otherwise :exc:`NotImplementedError`
        (a harness that needs it reports FATAL ``environment_unsupported``).
        ``close``, ``reap`` and ``sweep`` detach it; the host directory is
        never written or deleted."""
        if self.exposed is None:
            raise NotImplementedError(
                f"docker session {self.name}: host directories can be exposed only by root, "
                "to a daemon on this host that sees its mounts"
            )
        async with self._close_lock:
            container = self._check_open()
            label = f"d{next(self._labels)}"
            try:
                inside = await trio.to_thread.run_sync(_expose.expose, self.name, os.fspath(host_path), label)
            except (OSError, _expose.HostError) as exc:
                with trio.move_on_at(cleanup_deadline(), shield=True):
                    await trio.to_thread.run_sync(_expose.unexpose, self.name, label)
                raise IssueError(
                    "fatal", "environment_failed", f"docker session {self.name}: could not expose {host_path}: {exc}"
                ) from None
            reached = False
            try:
                stat = await self.engine.path_stat(container, inside)
                reached = stat is not None and await trio.to_thread.run_sync(
                    _expose.reached, os.fspath(host_path), int(stat.get("mode", 0))
                )
            finally:
                if not reached:  # undone, whatever stopped the check
                    with trio.move_on_at(cleanup_deadline(), shield=True):
                        await trio.to_thread.run_sync(_expose.unexpose, self.name, label)
            if not reached:
                raise NotImplementedError(
                    f"docker session {self.name}: the daemon does not see this host's mounts "
                    "(it runs in another mount namespace or on another host)"
                )
            return inside

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
        """Run ``cmd`` as :meth:`exec` does, with ``directory`` and the
        inputs' directories private (see
        :meth:`agentcompass.EnvironmentSession.exec_private`).

        Made from the host (``_private``) where the daemon runs on this host
        and the runtime is root: the command is in the container's
        namespaces but its pid one, its cgroups and confinement (user,
        capabilities, no_new_privs, seccomp filters), in a pid namespace and
        over a root no process of the container can see or reach. Elsewhere
        :exc:`NotImplementedError`, so the caller falls back to :meth:`exec`
        and :meth:`read_file`, after the provider has said once in the run's
        log why and that a process the agent left running can race that
        verifier (docs/docker.md, "Threat model")."""
        try:
            if isinstance(self.private, str):
                raise _private.NotLocal(self.private)
            return await _private.exec_private(
                self,
                self.private or _private.NO_SNAPSHOT,
                cmd,
                timeout,
                cwd,
                env,
                directory=directory,
                max_bytes=max_bytes,
                inputs=inputs,
            )
        except _private.NotLocal as exc:
            if self.on_not_private is not None:
                self.on_not_private(str(exc))
            raise NotImplementedError(f"docker session {self.name}: no private run here: {exc}") from None

    # -- network -----------------------------------------------------------

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the policy while processes keep running: ``none`` detaches
        the container from its network (loopback stays), the others attach
        it; the nftables rules of the mode replace the previous ones."""
        self._check_open()
        await self._apply(policy)

    async def _apply(self, policy: NetworkPolicy) -> None:
        resolved = None
        if policy.mode == "allowlist":
            try:
                resolved = await trio.to_thread.run_sync(netpolicy.resolve, policy.allow, self.lookup)
            except ValueError as exc:
                raise IssueError("fatal", "environment_failed", f"docker session {self.name}: {exc}") from None
        # Rules first when narrowing, so no moment has the new interface without them.
        await self._install(netpolicy.ruleset(policy.mode, resolved, refuse=(EMBEDDED_DNS,)))
        if policy.mode == "none":
            await self._disconnect()
        else:
            await self._connect()
            await self._find_gateway()
        self._policy = policy

    async def _connect(self) -> None:
        if self._attached:
            return
        await self.engine.request("POST", f"/networks/{self.network}/connect", body={"Container": self.container})
        self._attached = True

    async def _disconnect(self) -> None:
        if not self._attached:
            return
        await self.engine.request(
            "POST", f"/networks/{self.network}/disconnect", body={"Container": self.container, "Force": True}
        )
        self._attached = False

    async def _find_gateway(self) -> None:
        if self.gateway is None:
            info = await self.engine.request("GET", f"/networks/{self.network}")
            configs = (info.get("IPAM") or {}).get("Config") or []
            self.gateway = next((c["Gateway"] for c in configs if c.get("Gateway")), None)

    async def _install(self, ruleset: str) -> None:
        """Run ``nft -f -`` in the container's network namespace, entered by
        a descriptor opened while the container was known to run with that pid."""
        container = self._check_open()
        info = await self.engine.request("GET", f"/containers/{container}/json")
        pid = (info.get("State") or {}).get("Pid") or 0
        if pid <= 0:
            raise IssueError("fatal", "environment_failed", f"docker session {self.name}: the container is not running")
        fd = await trio.to_thread.run_sync(os.open, f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            again = await self.engine.request("GET", f"/containers/{container}/json")
            if (again.get("State") or {}).get("Pid") != pid:
                raise IssueError("fatal", "environment_failed", f"docker session {self.name}: the container restarted")
            result = await trio.run_process(
                ["nsenter", f"--net=/proc/self/fd/{fd}", "nft", "-f", "-"],
                stdin=ruleset.encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                pass_fds=(fd,),
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        finally:
            os.close(fd)
        if result.returncode != 0:
            raise IssueError(
                "fatal",
                "environment_failed",
                f"docker session {self.name}: nft failed: {result.stderr.decode(errors='replace').strip()[:300]}",
            )

    # -- closing -----------------------------------------------------------

    def _check_open(self) -> str:
        if self._closed or self.container is None:
            raise IssueError("fatal", "environment_failed", f"docker session {self.name} is closed")
        return self.container

    async def close(self) -> None:
        """Remove the container (killing everything in it), its network and
        the exposures (detached, their directories removed; the host's
        directories themselves are never touched). Idempotent."""
        self._closed = True
        async with self._close_lock:
            container = self.container or (self.name if self._creating else None)
            try:
                await remove(self.engine, container, self.network)
            finally:
                if self._state:
                    await trio.to_thread.run_sync(_expose.destroy, self.name)
                    self._state = False


async def remove(engine: Engine, container: str | None, network: str | None) -> None:
    """Remove a container (forced, with its anonymous volumes) and a network; absent ones are fine."""
    if container:
        try:
            await engine.request("DELETE", f"/containers/{container}", params={"force": True, "v": True})
        except EngineError as exc:
            if exc.status == 409 and "in progress" in exc.message:
                # An earlier close, cut short, is removing it: wait until it is gone.
                await _until_gone(engine, f"/containers/{container}/json")
            elif exc.status != 404:
                raise
    if network:
        try:
            await engine.request("DELETE", f"/networks/{network}")
        except EngineError as exc:
            if exc.status != 404:
                raise


async def _until_gone(engine: Engine, path: str) -> None:
    pause = 0.01
    while True:
        try:
            await engine.request("GET", path)
        except EngineError as exc:
            if exc.status == 404:
                return
            raise
        await trio.sleep(pause)
        pause = min(pause * 2, 0.5)


def _namespace_pid(host_pid: int) -> int | None:
    """The pid of ``host_pid`` in its innermost pid namespace (``NSpid``), or None if it is gone."""
    try:
        with open(f"/proc/{host_pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None
