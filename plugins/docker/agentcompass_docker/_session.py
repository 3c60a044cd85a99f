"""One open ``docker`` session: a container, its own network, and execs.

The container runs ``sleep infinity`` under Docker's init (``--init``), not
the image's command, so it lives until :meth:`DockerSession.close` and reaps
the orphans commands leave. It is attached to a bridge network of its own
(``full`` and ``allowlist``) or to none (``none``: loopback only); the
policy's rules are nftables rules installed from the host in the container's
network namespace, which its processes cannot change (``NET_ADMIN`` is not
among their capabilities).

Every ``exec`` is an Engine API exec read as the daemon's multiplexed
stream; at a timeout or a cancellation the command's whole tree is killed
inside the container (``_exec``).
"""

from __future__ import annotations

import io
import itertools
import os
import posixpath
import tarfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import trio

from agentcompass import EnvironmentSession, ExecResult, IssueError, NetworkPolicy, netpolicy
from agentcompass.runtime import (
    DEFAULT_MAX_READ_BYTES,
    OutputCallback,
    cleanup_deadline,
    exec_keeping_tails,
)

from . import _expose, _private
from ._api import Engine, EngineError
from ._archive import first_member
from ._container import ContainerSpec, create_failed, remove, storage_unsupported
from ._exec import run_command
from ._network import install_ruleset

#: The labels on everything a session is made of.
SESSION_LABEL = "agentcompass.session"
RUN_LABEL = "agentcompass.run"
#: Docker's embedded DNS server: on the container's loopback, forwarding from
#: the daemon outside the rules, so ``none`` and ``allowlist`` refuse it and
#: names do not resolve inside (an allowlisted name is allowed at the
#: addresses it had on the host when the policy was applied).
EMBEDDED_DNS = "127.0.0.11"
#: How long a container or network create may take (it is not cut short, see DockerSession._made).
CREATE_SECONDS = 60


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
        """:meth:`exec`, handing the output to ``on_output`` as the daemon sends it (see ``_exec``)."""
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
        return await run_command(self.engine, container, f"docker session {self.name}", body, timeout, on_output)

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
        """:meth:`agentcompass.EnvironmentSession.exec_private`, made from
        the host (``_private``) where the daemon runs on this host and the
        runtime is root: in the container's namespaces but its pid one, its
        cgroups and confinement (user, capabilities, no_new_privs, seccomp
        filters), in a pid namespace and over a root no process of the
        container can see or reach. Elsewhere :exc:`NotImplementedError`, so
        the caller falls back to :meth:`exec` and :meth:`read_file`, after the
        provider has said once in the run's log why and that a process the
        agent left running can race that verifier (docs/docker.md)."""
        try:
            if isinstance(self.private, str):
                raise _private.NotLocal(self.private)
            snap = self.private or _private.NO_SNAPSHOT
            return await _private.exec_private(
                self, snap, cmd, timeout, cwd, env, directory=directory, max_bytes=max_bytes, inputs=inputs
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
        await install_ruleset(self.engine, self._check_open(), f"docker session {self.name}", ruleset)

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
