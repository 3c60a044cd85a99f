"""The wire protocol shared by the server and the ``remote`` provider.

Text messages are JSON objects with a ``type``; binary messages carry file
data and exec output, each prefixed by :data:`HEADER` (the operation id and
what the bytes are). ``docs/remote-protocol.md`` describes the exchange.
"""

from __future__ import annotations

import json
import posixpath
import re
import socket
import struct
from pathlib import Path
from typing import Any

from agentcompass import NetworkPolicy, SandboxSpec

__all__ = [
    "CHUNK",
    "OUTPUT_CHUNK",
    "HEADER",
    "MAX_MESSAGE_BYTES",
    "NAME_RE",
    "STDERR",
    "STDOUT",
    "FILE",
    "CHANNEL",
    "FILE_REFUSED",
    "NOT_IMPLEMENTED",
    "VERSION",
    "WRONG_VERSION",
    "ProtocolError",
    "check_path",
    "sandbox_from_message",
    "sandbox_message",
    "decode",
    "encode",
    "pack_chunk",
    "policy_message",
    "set_keepalive",
    "unpack_chunk",
]

#: Bumped on any incompatible change; both sides refuse another version.
#: 3: ``read_file`` carries ``max_bytes``, refusals come back as ``file_refused``,
#: and ``exec_private`` is forwarded, its ``inputs`` as file data after it.
#: 5: ``expose`` and ``expose_cached``, and relayed channels (``_relay``).
VERSION = 5
#: The close code of a hello with the right token and another protocol version.
WRONG_VERSION = 4002
#: The ``code`` of an error that is a :class:`~agentcompass.FileRefusedError`.
FILE_REFUSED = "file_refused"
#: The ``code`` of an error that is a :class:`NotImplementedError` (an optional operation).
NOT_IMPLEMENTED = "not_implemented"
#: Binary message prefix: operation id (u32), kind (u8).
HEADER = struct.Struct("!IB")
STDOUT, STDERR, FILE, CHANNEL = 1, 2, 3, 4
#: Payload bytes per binary message from the client (file data): well
#: under the server's message limit.
CHUNK = 256 * 1024
#: Payload bytes per binary message from the server (output, file data):
#: fewer, larger messages for throughput; the client accepts 4 MiB.
OUTPUT_CHUNK = 1024 * 1024
#: Largest message either side accepts by default (a chunk, a long command).
MAX_MESSAGE_BYTES = 1024 * 1024
#: Session names, as the runtime makes them.
NAME_RE = re.compile(r"[a-z0-9-]{1,40}")
#: Absolute paths must stay under these roots (the Harbor task layout).
ROOTS = ("/app", "/tests", "/logs", "/solution")


#: TCP keepalive: first probe after this many idle seconds, then every
#: interval, giving up after this many unanswered probes.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3


def set_keepalive(sock: Any) -> None:
    """Have the kernel probe an idle connection, so a peer that vanished
    without a FIN or RST breaks it (the application does not need to ping)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        if hasattr(socket, name):  # Linux; elsewhere the system defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow."""


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def decode(text: str | bytes) -> dict[str, Any]:
    if not isinstance(text, str):
        raise ProtocolError("expected a JSON text message, got binary data")
    try:
        message = json.loads(text)
    except ValueError:
        raise ProtocolError("a text message is not valid JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a text message is not a JSON object with a 'type'")
    return message


def pack_chunk(op: int, kind: int, data: bytes | memoryview) -> bytes:
    return b"".join((HEADER.pack(op, kind), data))


def unpack_chunk(message: bytes) -> tuple[int, int, bytes]:
    if len(message) < HEADER.size:
        raise ProtocolError("a binary message is shorter than its header")
    op, kind = HEADER.unpack_from(message)
    return op, kind, message[HEADER.size :]


def check_path(path: Any, what: str = "path") -> str:
    """Refuse a path that leaves the session: ``..`` above the sandbox, an
    absolute path outside the task roots, NUL bytes. Checked by the server
    before the backend sees it (the backend checks again, with symlinks)."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ProtocolError(f"{what} must be a non-empty string without NUL bytes")
    normal = posixpath.normpath(path)
    if posixpath.isabs(path):
        if not any(normal == root or normal.startswith(root + "/") for root in ROOTS):
            raise ProtocolError(
                f"{what} {path!r} is outside the session (absolute paths must be under {', '.join(ROOTS)})"
            )
    elif normal == ".." or normal.startswith("../"):
        raise ProtocolError(f"{what} {path!r} is outside the session")
    return path


_SANDBOX_TEXT = ("image", "workdir", "user", "build_context")
_SANDBOX_NUMBERS = ("build_timeout_seconds", "cpus", "memory_mb", "storage_mb")


def policy_message(policy: NetworkPolicy) -> dict[str, Any]:
    """A network policy as the server reads it (``_operations.parse_policy``)."""
    return {"mode": policy.mode, "allow": list(policy.allow)}


def sandbox_message(spec: SandboxSpec) -> dict[str, Any]:
    """A plan's :class:`SandboxSpec` as an ``open`` message field (fields left unset are left out)."""
    message: dict[str, Any] = {name: getattr(spec, name) for name in (*_SANDBOX_TEXT, *_SANDBOX_NUMBERS)}
    if message["build_context"] is not None:
        message["build_context"] = str(message["build_context"])
    message["env"] = dict(spec.env)
    return {key: value for key, value in message.items() if value not in (None, {})}


def sandbox_from_message(raw: Any) -> SandboxSpec:
    """The :class:`SandboxSpec` of an ``open`` message; :class:`ProtocolError` if malformed."""
    if raw is None:
        return SandboxSpec()
    if not isinstance(raw, dict) or set(raw) - {*_SANDBOX_TEXT, *_SANDBOX_NUMBERS, "env"}:
        raise ProtocolError(f"not a sandbox spec: {str(raw)[:200]}")
    for name in _SANDBOX_TEXT:
        if not isinstance(raw.get(name, ""), str):
            raise ProtocolError(f"sandbox {name} must be a string")
    for name in _SANDBOX_NUMBERS:
        value = raw.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"sandbox {name} must be a number")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("sandbox env must map names to strings")
    build_context = raw.get("build_context")
    return SandboxSpec(
        image=raw.get("image"),
        build_context=Path(build_context) if build_context is not None else None,
        build_timeout_seconds=raw.get("build_timeout_seconds"),
        workdir=raw.get("workdir"),
        env=env,
        cpus=raw.get("cpus"),
        memory_mb=raw.get("memory_mb"),
        storage_mb=raw.get("storage_mb"),
        user=raw.get("user"),
    )
