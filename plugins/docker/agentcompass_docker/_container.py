"""What a session's container is created with, and how it and its network are removed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from agentcompass import IssueError

from ._api import Engine, EngineError
from ._expose import INSIDE


def storage_unsupported(exc: EngineError) -> bool:
    """Whether a create failed over its storage limit (overlay2 limits storage only on xfs with pquota)."""
    return "storage" in exc.message.lower()


def create_failed(exc: EngineError, name: str, spec: ContainerSpec) -> IssueError:
    if spec.storage_mb is not None and storage_unsupported(exc):
        return IssueError(
            "fatal",
            "environment_unsupported",
            f"docker session {name}: the daemon cannot limit storage ({exc.message[:300]})",
            phase="setup",
        )
    return IssueError(
        "fatal", "environment_failed", f"docker session {name}: creating the container failed: {exc}", phase="setup"
    )


#: Capabilities Docker grants by default that no task needs: raw sockets
#: (spoofing on the session's network), device nodes, audit writes, file
#: capabilities. ``NET_ADMIN`` is not granted by default and never added.
DROPPED_CAPABILITIES = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "NET_ADMIN", "SYS_ADMIN")


@attrs.frozen
class ContainerSpec:
    """What the container is created with: the plan's ``SandboxSpec`` over the provider's defaults."""

    workdir: str | None = None
    env: Mapping[str, str] = attrs.Factory(dict)
    user: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    pids_max: int | None = None

    def create_body(
        self, image: str, labels: dict[str, str], network: str, exposed: str | None = None
    ) -> dict[str, Any]:
        """The ``POST /containers/create`` body; ``exposed`` is the host
        directory bound read-only, with slave propagation, at ``/run/agentcompass``
        (``_expose``)."""
        host: dict[str, Any] = {
            "NetworkMode": network,
            "Init": True,
            "CapDrop": list(DROPPED_CAPABILITIES),
            "SecurityOpt": ["no-new-privileges"],
            "Privileged": False,
            "ReadonlyRootfs": False,
            "RestartPolicy": {"Name": "no"},
            "LogConfig": {"Type": "none", "Config": {}},
        }
        if exposed is not None:
            host["Mounts"] = [
                {
                    "Type": "bind",
                    "Source": exposed,
                    "Target": INSIDE,
                    "ReadOnly": True,
                    "BindOptions": {"Propagation": "rslave"},
                }
            ]
        if self.pids_max is not None:
            host["PidsLimit"] = self.pids_max
        if self.memory_mb is not None:
            host["Memory"] = self.memory_mb << 20
            host["MemorySwap"] = self.memory_mb << 20
        if self.cpus is not None:
            host["NanoCpus"] = int(self.cpus * 1e9)
        if self.storage_mb is not None:
            host["StorageOpt"] = {"size": f"{self.storage_mb}M"}
        body: dict[str, Any] = {
            "Image": image,
            "Entrypoint": ["sleep", "infinity"],
            "Cmd": [],
            "Env": [f"{k}={v}" for k, v in self.env.items()],
            "Labels": labels,
            "HostConfig": host,
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "Tty": False,
            "OpenStdin": False,
        }
        if self.workdir:
            body["WorkingDir"] = self.workdir
        if self.user:
            body["User"] = self.user
        return body


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
