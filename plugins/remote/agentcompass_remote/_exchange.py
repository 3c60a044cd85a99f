"""One ``remote`` session's connection as a sequence of operations.

Operations run one at a time (a lock): each sends its request whole, then
reads its replies until its final message. A cancelled operation is
cancelled on the server too, and its replies drained, so the session stays
usable; a lost connection is FATAL ``environment_failed``. Relayed channels
(see ``_relay``) are pumped by tasks of the operation that reads the
connection, and wait, within their windows, between operations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio

from agentcompass.runtime import cleanup_deadline

from . import _protocol as p
from ._client import ClientConnection, ConnectionLost
from ._failures import fail, reason, reply_error
from ._relay import CONTROL, MAX_CHANNELS, Channel, Channels

__all__ = ["Exchange"]


class _SessionEnded(Exception):
    """The server closed the session (a reap or sweep from elsewhere)."""


@attrs.define(eq=False)
class Exchange:
    """The operations of session ``name`` on the server at ``url`` over
    ``conn``; ``on_lost`` is told when the connection is lost."""

    conn: ClientConnection
    name: str
    url: str
    on_lost: Callable[[], None]
    lock: trio.Lock = attrs.Factory(trio.Lock)
    channels: Channels = attrs.Factory(Channels)
    #: Closed by the client; ``ended``: the server closed the session and said so.
    closed: bool = False
    ended: bool = False
    _ops: int = 0
    #: The running operation's pumps, while it reads.
    _pumps: trio.Nursery | None = None

    def check_open(self) -> None:
        if self.closed:
            raise fail(f"remote session {self.name} on {self.url} is closed")
        if self.conn.closed:
            raise fail(f"the connection to {self.url} for session {self.name} was lost")

    async def request(self, message: dict[str, Any], on_chunk: Any = None, data: bytes | None = None) -> dict[str, Any]:
        """Send one operation and read its replies until it ends. A lost
        connection is FATAL ``environment_failed``; a cancellation asks the
        server to cancel the operation and waits (briefly, shielded) for it."""
        async with self.lock:
            self.check_open()
            self._ops += 1
            op = self._ops
            try:
                if data is None:
                    await self.send({**message, "id": op})
                else:
                    # The request and the first chunk go in one write.
                    view = memoryview(data)
                    first = [p.pack_chunk(op, p.FILE, view[: p.CHUNK])] if view else []
                    await self.send({**message, "id": op}, *first)
                    for start in range(p.CHUNK, len(view), p.CHUNK):
                        await self.send(p.pack_chunk(op, p.FILE, view[start : start + p.CHUNK]))
                reply = await self._until_done_relaying(op, on_chunk)
            except _SessionEnded:
                self.ended = True
                self.channels.close_all()
                await self.conn.abort()
                raise fail(f"the server closed session {self.name} (reaped or swept)") from None
            except (ConnectionLost, p.ProtocolError) as exc:
                self.channels.close_all()
                await self.conn.abort()
                self.on_lost()
                raise fail(f"sandbox server {self.url}: {reason(exc)}") from None
            except BaseException:
                await self.abandon(op)
                raise
        if reply["type"] == "error":
            raise reply_error(reply)
        return reply

    async def send(self, *messages: dict[str, Any] | bytes) -> None:
        """Send whole messages even when cancelled (briefly, shielded): a
        write cut short would leave half a frame on the connection and lose
        the session; a cancellation lands at the next receive instead."""
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await self.conn.send(*messages)
            return
        await self.conn.abort()
        raise ConnectionLost("a write to the server did not finish")

    async def _until_done_relaying(self, op: int, on_chunk: Any) -> dict[str, Any]:
        """:meth:`_until_done`, with the relayed channels pumped meanwhile
        (in tasks of their own, stopped when it returns: see ``_relay``)."""
        if not self.channels.relays:
            return await self._until_done(op, on_chunk)
        pumping = trio.CancelScope()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._pump, pumping)
                try:
                    return await self._until_done(op, on_chunk)
                finally:
                    pumping.cancel()
        except BaseExceptionGroup as group:
            # The pumps never raise: what failed is the reading, raised as itself.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _pump(self, scope: trio.CancelScope, task_status: trio.TaskStatus[None]) -> None:
        with scope:
            try:
                async with trio.open_nursery() as pumps:
                    self._pumps = pumps
                    for channel in list(self.channels.open.values()):
                        pumps.start_soon(self.channels.serve, channel, self._send_frame)
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._pumps = None

    async def _send_frame(self, message: dict[str, Any] | bytes) -> None:
        await self.send(message)

    def _relayed(self, message: dict[str, Any] | bytes) -> bool:
        """Take a relay message (channel data, a new channel, a window, an
        end); False for anything else. Never waits."""
        if isinstance(message, bytes):
            channel, kind, payload = p.unpack_chunk(message)
            if kind != p.CHANNEL:
                return False
            self.channels.data(channel, payload)
            return True
        kind = message["type"]
        if kind in CONTROL:
            self.channels.control(message)
            return True
        if kind != "channel":
            return False
        cid, relay = message.get("channel"), message.get("relay")
        if not isinstance(cid, int) or cid in self.channels.open:
            raise p.ProtocolError(f"a new channel {cid!r} that is not new")
        target = self.channels.relays.get(relay) if isinstance(relay, int) else None
        # An unknown relay, or one channel too many: reset by the pump (its connect fails).
        opened = Channel(cid, None, target if len(self.channels.open) < MAX_CHANNELS else None)
        self.channels.open[cid] = opened
        if self._pumps is not None:
            self._pumps.start_soon(self.channels.serve, opened, self._send_frame)
        return True

    async def _until_done(self, op: int, on_chunk: Any) -> dict[str, Any]:
        """Replies of ``op`` up to its last one (``error`` included)."""
        while True:
            message = await self.conn.receive()
            if self._relayed(message):
                continue
            if isinstance(message, bytes):
                chunk_op, kind, payload = p.unpack_chunk(message)
                if chunk_op != op or on_chunk is None:
                    raise p.ProtocolError("unexpected binary data")
                await on_chunk(kind, payload)
                continue
            kind = message["type"]
            if kind == "closed":
                raise _SessionEnded
            if message.get("id") != op:
                raise p.ProtocolError(f"a reply for operation {message.get('id')!r} while waiting for {op}")
            return message

    async def abandon(self, op: int) -> None:
        """The caller gave up on ``op`` (cancelled): cancel it on the server
        and drain its replies, or drop the connection if that overruns."""
        if self.conn.closed:
            return
        with trio.move_on_at(cleanup_deadline(), shield=True):
            try:
                self._ops += 1
                await self.conn.send({"type": "cancel", "id": self._ops, "target": op})
                while True:
                    message = await self.conn.receive()
                    if self._relayed(message):
                        continue  # kept for the next operation's pumps
                    if isinstance(message, dict) and (message.get("id") == op or message["type"] == "closed"):
                        if message["type"] != "closed":
                            return  # the operation ended (cancelled, or finished first)
                        self.ended = True
                        break
            except (ConnectionLost, p.ProtocolError):
                pass
        await self.conn.abort()
