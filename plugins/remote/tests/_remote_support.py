"""Helpers of the ``remote`` tests: real sandbox servers on 127.0.0.1 port 0,
in this Trio run or as ``compass sandbox serve`` subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _common import poll_until
from agentcompass_remote import PROTOCOL_VERSION, RemoteEnvironment, SandboxServer, serve_sandboxes

from agentcompass import NetworkPolicy
from agentcompass.environments.local import LocalEnvironment

try:
    import agentcompass_sandbox
except ImportError:  # the remote plugin does not need the sandbox plugin
    agentcompass_sandbox = None

TOKEN = "test-token-0123456789"
SANDBOX_PROBLEM = (
    "the sandbox plugin is not installed" if agentcompass_sandbox is None else agentcompass_sandbox.host_problem()
)
#: Tests of ``remote`` backed by ``sandbox``, skipped with the sandbox's own
#: preflight message where this host cannot run it.
requires_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=SANDBOX_PROBLEM or "")
#: How long a test waits for a real process or server to reach a state
#: (``poll_until`` from the suite's ``_common``, as ``processes_marked``).
WAIT_SECONDS = 20.0


@attrs.define(eq=False)
class InProcess:
    server: SandboxServer
    url: str
    root: Path

    def sandboxes(self) -> list[Path]:
        return sorted(self.root.iterdir()) if self.root.exists() else []

    async def settled_count(self) -> int:
        """The number of sandbox directories once the server has no session
        open or opening (a session whose client went away closes on its own)."""
        await poll_until(lambda: self.server.load == 0, "the server to close its sessions", WAIT_SECONDS)
        return len(self.sandboxes())


def remote(url: str | list[str], **config: object) -> RemoteEnvironment:
    """The ``remote`` provider on ``url`` (one server or a pool), with the tests' token."""
    return RemoteEnvironment({"url": url, "token": TOKEN, **config})


async def exec_locally_and_remotely(url: str, root: Path, command: str, max_output_bytes: int) -> tuple[Any, Any]:
    """``command``'s result on ``local`` under ``root`` and through the server at
    ``url``, both keeping ``max_output_bytes`` per stream: (local, remote)."""
    results = []
    for env in (
        LocalEnvironment({"root": str(root), "max_output_bytes": max_output_bytes}),
        remote(url, provider_config={"max_output_bytes": max_output_bytes}),
    ):
        session = await env.open(None, NetworkPolicy())
        try:
            results.append(await session.exec(command))
        finally:
            await session.close()
    return results[0], results[1]


async def start_in_process(nursery: trio.Nursery, root: Path, **options: Any) -> InProcess:
    """A server (backed by ``local`` under ``root``) served in ``nursery``."""
    server = SandboxServer("local", TOKEN, default_config={"root": str(root)}, **options)
    port = await nursery.start(serve_sandboxes, server, "127.0.0.1", 0)
    return InProcess(server, f"ws://127.0.0.1:{port}", root)


@attrs.define(eq=False)
class Spawned:
    """A ``compass sandbox serve`` subprocess."""

    process: trio.Process
    port: int
    root: Path
    output: bytes = b""

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def serve_command(token_file: Path, root: Path, port: int = 0, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentcompass._cli",
        "sandbox",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token-file",
        str(token_file),
        "--provider-config",
        f'{{"root": "{root}"}}',
        "--state-dir",
        f"{root}.state",
        *extra,  # a later --state-dir wins
    ]


async def start_spawned(token_file: Path, root: Path, port: int = 0, *extra: str) -> Spawned:
    """Start a server subprocess; return once it listens."""
    process = await trio.lowlevel.open_process(
        serve_command(token_file, root, port, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    spawned = Spawned(process, 0, root)
    assert process.stdout is not None
    with trio.fail_after(WAIT_SECONDS):
        while b"\n" not in spawned.output:
            chunk = await process.stdout.receive_some(4096)
            if not chunk:
                err = await process.stderr.receive_some(65536) if process.stderr else b""
                raise AssertionError(f"server on {root} exited before listening: {err.decode()}")
            spawned.output += chunk
    spawned.port = int(spawned.output.split(b"\n")[0].rsplit(b":", 1)[1])
    return spawned


async def hello(ws: Any, token: str | None = TOKEN) -> dict[str, Any]:
    """Authenticate a raw trio-websocket connection; return the welcome."""
    message: dict[str, Any] = {"type": "hello", "version": PROTOCOL_VERSION}
    if token is not None:
        message["token"] = token
    await ws.send_message(json.dumps(message))
    return json.loads(await ws.get_message())


async def open_raw(ws: Any, name: str = "raw-1", provider: str = "local") -> dict[str, Any]:
    """Authenticate and open a session (``local``'s by default) on a raw connection."""
    await hello(ws)
    policy = {"mode": "full", "allow": []}
    await ws.send_message(json.dumps({"type": "open", "name": name, "provider": provider, "policy": policy}))
    reply = json.loads(await ws.get_message())
    assert reply["type"] == "opened", reply
    return reply


async def ask(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    """Send one operation; return its final JSON reply (binary data skipped)."""
    await ws.send_message(json.dumps(message))
    while True:
        reply = await ws.get_message()
        if isinstance(reply, str):
            return json.loads(reply)
