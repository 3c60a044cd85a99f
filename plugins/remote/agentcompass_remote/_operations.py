"""What each operation of a hosted session does on the provider's session,
answering its client through ``send`` (the session loop in ``_hosted`` runs
each as a task of its own, so ``cancel`` can reach it)."""

from __future__ import annotations

import inspect
from typing import Any

import trio

from agentcompass import BaseEnvironment, EnvironmentSession, FileRefusedError, IssueError, NetworkPolicy

from . import _expose
from . import _protocol as p
from ._listen import log
from ._relay import MAX_CHANNELS, Channel, Channels

__all__ = [
    "accept_relay",
    "error_reply",
    "expose_cached",
    "open_session",
    "output_limit",
    "parse_policy",
    "read",
    "run_exec",
    "run_exec_private",
    "set_policy",
    "write",
]


def parse_policy(raw: Any) -> NetworkPolicy:
    if not isinstance(raw, dict) or raw.get("mode") not in ("none", "allowlist", "full"):
        raise p.ProtocolError(f"not a network policy: {raw!r}")
    allow = raw.get("allow") or []
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise p.ProtocolError(f"not a network policy: {raw!r}")
    return NetworkPolicy(raw["mode"], tuple(allow))


def error_reply(op: int | None, exc: BaseException) -> dict[str, Any]:
    """An operation's failure as a message (one line, no traceback)."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    reply: dict[str, Any] = {"type": "error", "id": op, "severity": "fatal", "code": "environment_failed"}
    if isinstance(exc, FileRefusedError):
        # What the session made, not a failure of the server: the client raises it as such.
        reply.update(code=p.FILE_REFUSED, message=message)
    elif isinstance(exc, NotImplementedError):
        # An optional operation the provider lacks (``exec_private``): the caller falls back.
        reply.update(code=p.NOT_IMPLEMENTED, message=message)
    elif isinstance(exc, IssueError):
        reply.update(severity=exc.severity, code=exc.code, message=exc.message)
    elif isinstance(exc, OSError) and exc.errno is not None:
        reply.update(errno=exc.errno, message=exc.strerror or message)
    else:
        reply["message"] = message
    return reply


async def open_session(backend: BaseEnvironment, config: Any, policy: NetworkPolicy, name: str) -> EnvironmentSession:
    """The backend's ``open``, passing the session name to providers that take it."""
    if "name" in inspect.signature(backend.open).parameters:
        return await backend.open(config, policy, name=name)  # type: ignore[call-arg]
    return await backend.open(config, policy)


def output_limit(backend: BaseEnvironment, session: EnvironmentSession) -> int | None:
    """The per-stream limit the client applies to streamed exec output: the
    provider's ``max_output_bytes`` when the session streams raw output (its
    own ``exec_stream``); ``None`` when the output arrives as the provider's
    final, already truncated text (the default ``exec_stream``)."""
    if type(session).exec_stream is EnvironmentSession.exec_stream:
        return None
    limit = getattr(getattr(backend, "options", None), "max_output_bytes", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def exec_args(request: dict[str, Any]) -> tuple[str | list[str], float | None, str | None, dict[str, str] | None]:
    """``cmd``, ``timeout``, ``cwd`` and ``env`` of an exec request, checked."""
    cmd = request.get("cmd")
    if not (isinstance(cmd, str) or (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd))):
        raise p.ProtocolError("cmd must be a string or a non-empty list of strings")
    cwd = request.get("cwd")
    if cwd is not None:
        p.check_path(cwd, "cwd")
    env = request.get("env")
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise p.ProtocolError("env must map names to strings")
    timeout = request.get("timeout")
    if timeout is not None and not isinstance(timeout, int | float):
        raise p.ProtocolError("timeout must be a number")
    return cmd, timeout, cwd, env


async def run_exec(send: Any, op: int, session: EnvironmentSession, request: dict[str, Any]) -> None:
    cmd, timeout, cwd, env = exec_args(request)

    async def forward(stream: str, chunk: bytes) -> None:
        # Awaiting the send is the backpressure: a slow client stalls the command's pipe.
        kind = p.STDOUT if stream == "stdout" else p.STDERR
        data = memoryview(chunk)
        for start in range(0, len(data), p.OUTPUT_CHUNK):
            await send(p.pack_chunk(op, kind, data[start : start + p.OUTPUT_CHUNK]))

    result = await session.exec_stream(cmd, timeout, cwd, env, on_output=forward)
    await send({"type": "exit", "id": op, "exit_code": result.exit_code, "timed_out": result.timed_out})


async def send_data(send: Any, op: int, kind: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    for start in range(0, len(view), p.OUTPUT_CHUNK):
        await send(p.pack_chunk(op, kind, view[start : start + p.OUTPUT_CHUNK]))


async def run_exec_private(
    send: Any, op: int, session: EnvironmentSession, request: dict[str, Any], max_bytes: int, inputs: dict[str, bytes]
) -> None:
    """The backend's ``exec_private`` with the client's inputs: its output,
    then the files it brought back (their bytes in the order of the final
    message's ``files``)."""
    cmd, timeout, cwd, env = exec_args(request)
    directory = p.check_path(request.get("directory"), "directory")
    options: dict[str, Any] = {"directory": directory, "max_bytes": max_bytes}
    if inputs:  # providers written before inputs keep working without them
        options["inputs"] = inputs
    result, files = await session.exec_private(cmd, timeout, cwd, env, **options)
    await send_data(send, op, p.STDOUT, result.stdout.encode("utf-8", errors="surrogateescape"))
    await send_data(send, op, p.STDERR, result.stderr.encode("utf-8", errors="surrogateescape"))
    sizes = []
    for path, content in files.items():
        await send_data(send, op, p.FILE, content)
        sizes.append([path, len(content)])
    final = {"type": "private_exit", "id": op, "exit_code": result.exit_code, "timed_out": result.timed_out}
    await send({**final, "files": sizes})


async def accept_relay(
    listener: trio.socket.SocketType, relay: int, channels: Channels, send: Any, nursery: trio.Nursery
) -> None:
    """Every connection to a relay's socket becomes a channel, up to the
    session's limit (one more is closed at once); ends with the session."""
    with listener:
        while True:
            try:
                sock, _ = await listener.accept()
            except OSError as exc:
                log.warning("relay %d: accept failed: %s", relay, exc)
                await trio.sleep(0.1)  # out of descriptors: the connection waits in the backlog
                continue
            if len(channels.open) >= MAX_CHANNELS:
                sock.close()
                continue
            channel = Channel(channels.next_id(), sock)
            channels.open[channel.id] = channel
            await send({"type": "channel", "relay": relay, "channel": channel.id})
            nursery.start_soon(channels.serve, channel, send)


async def expose_cached(send: Any, op: int, session: EnvironmentSession, entry: Any, installed: Any) -> None:
    """Expose this server's own agent cache entry ``entry`` when it is the
    client's install (see ``_expose.server_entry``)."""
    path = await trio.to_thread.run_sync(_expose.server_entry, entry, installed)
    inside = await session.expose_directory(path)
    await send({"type": "exposed", "id": op, "path": inside, "relays": []})


async def read(send: Any, op: int, session: EnvironmentSession, path: Any, max_bytes: int) -> None:
    path = p.check_path(path)
    if "max_bytes" in inspect.signature(session.read_file).parameters:
        content = await session.read_file(path, max_bytes)
    else:  # a provider written before max_bytes: the cap is applied here
        content = await session.read_file(path)
    if len(content) > max_bytes:
        raise FileRefusedError(f"{path!r} is larger than {max_bytes} bytes")
    data = memoryview(content)
    for start in range(0, len(data), p.OUTPUT_CHUNK):
        await send(p.pack_chunk(op, p.FILE, data[start : start + p.OUTPUT_CHUNK]))
    await send({"type": "done", "id": op, "size": len(data)})


async def write(send: Any, op: int, session: EnvironmentSession, path: Any, data: bytes) -> None:
    await session.write_file(p.check_path(path), data)
    await send({"type": "done", "id": op})


async def set_policy(send: Any, op: int, session: EnvironmentSession, policy: NetworkPolicy) -> None:
    await session.set_network_policy(policy)
    await send({"type": "done", "id": op})
