"""Relayed unix-socket connections over a session's WebSocket (protocol 5).

A relay is a unix socket the server listens on inside a session (through its
provider's ``expose_directory``) standing for a socket on the client's host
(the model gateway's). Every connection accepted there becomes a *channel*:
the server announces it (``{"type": "channel", "relay", "channel"}``), the
client connects it to the host's socket, and both sides pump bytes as
binary messages of kind :data:`CHANNEL` (the header's id is the channel's).

Flow control is a window per direction: a side sends at most
:data:`WINDOW` bytes the other has not acknowledged, and acknowledges
(``{"type": "window", "channel", "bytes"}``) only what it has written to its
own socket. So a peer that does not read (a silent process inside, a stalled
host service) holds at most one window per channel in the other side's
memory, and stalls only its own channel: every channel's pumps are tasks of
their own, never the reader of the connection. ``eof`` half-closes a
direction; ``reset`` drops a channel (a socket error, a refused connect).
Frames for a channel a side no longer knows are ignored: they may cross a
``reset`` on the wire.

Socket calls are trio's socket methods, each of which either happens or is
cancelled having done nothing, and ``send`` is expected to be whole or not
at all once called (the client's is shielded, bounded by the cleanup
deadline); so a client, which pumps only while one of its operations reads
the connection, can stop its pumps at the end of an operation and resume
them at the next one without losing a byte. The server's ``send`` is not
shielded: its pumps stop only with the session.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from . import _protocol as p

__all__ = ["CHANNEL_DATA", "MAX_CHANNELS", "MAX_RELAYS", "WINDOW", "Channel", "Channels"]

#: Unacknowledged bytes a side may send on one channel, per direction.
WINDOW = 256 * 1024
#: Payload bytes per data message.
CHANNEL_DATA = 64 * 1024
#: Channels open at once per session; a connection past it is closed at once.
MAX_CHANNELS = 32
#: Relayed sockets per session.
MAX_RELAYS = 8
#: Control messages a side may send about a channel.
CONTROL = frozenset({"window", "eof", "reset"})

Send = Callable[[dict[str, Any] | bytes], Awaitable[None]]


class Channel:
    """One relayed connection: the local socket and both windows."""

    def __init__(self, cid: int, sock: trio.socket.SocketType | None, target: str | None = None):
        self.id = cid
        self.sock = sock
        #: Where a client connects it (the host's socket); None on the server.
        self.target = target
        self.credit = WINDOW  # bytes we may still send
        self.inbox = bytearray()  # bytes from the peer not yet written to our socket
        self.unacked = 0  # bytes written to our socket the peer has not been told of
        self.peer_eof = False
        self.sent_eof = False
        self.wrote_eof = False
        self.done = False
        self.scope: trio.CancelScope | None = None
        self._changed = trio.Event()

    def wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        await self._changed.wait()

    @property
    def finished(self) -> bool:
        return self.sent_eof and self.wrote_eof and self.unacked == 0


class Channels:
    """The channels of one session, on either side."""

    def __init__(self) -> None:
        self.open: dict[int, Channel] = {}
        self.relays: dict[int, str] = {}  # relay id -> the host socket (client) or its path (server)
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def buffered(self) -> int:
        """Bytes held for all channels (at most ``WINDOW`` each)."""
        return sum(len(c.inbox) for c in self.open.values())

    # -- what the peer sent (synchronous: the connection's reader never waits on a channel)

    def data(self, cid: int, payload: bytes) -> None:
        channel = self.open.get(cid)
        if channel is None:
            return  # crossed a reset
        if channel.peer_eof or len(channel.inbox) + len(payload) > WINDOW:
            raise p.ProtocolError(f"channel {cid}: data past its window or its end")
        channel.inbox += payload
        channel.wake()

    def control(self, message: dict[str, Any]) -> None:
        cid = message.get("channel")
        channel = self.open.get(cid) if isinstance(cid, int) else None
        if channel is None:
            return
        kind = message["type"]
        if kind == "window":
            count = message.get("bytes")
            if not isinstance(count, int) or count <= 0 or channel.credit + count > WINDOW:
                raise p.ProtocolError(f"channel {cid}: a window update of {count!r} bytes")
            channel.credit += count
        elif kind == "eof":
            channel.peer_eof = True
        else:  # reset
            self.drop(channel)
        channel.wake()

    def drop(self, channel: Channel) -> None:
        """Forget ``channel`` and close its socket (its pumps stop)."""
        channel.done = True
        self.open.pop(channel.id, None)
        if channel.scope is not None:
            channel.scope.cancel()
        if channel.sock is not None:
            channel.sock.close()
        channel.wake()

    def close_all(self) -> None:
        for channel in list(self.open.values()):
            self.drop(channel)
        self.relays.clear()

    # -- pumping

    async def serve(self, channel: Channel, send: Send) -> None:
        """Pump ``channel`` both ways until it ends (both directions closed,
        or reset) or this task is cancelled (a client's operation ended: the
        channel stays, and a later call resumes it). Never raises but
        :class:`trio.Cancelled`."""
        if channel.done:
            return
        failed = False
        try:
            if channel.sock is None:
                if channel.target is None:
                    raise OSError("no relay to connect this channel to (unknown, or one channel too many)")
                sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    await sock.connect(channel.target)
                except BaseException:
                    sock.close()
                    raise
                if channel.done:  # reset while connecting
                    sock.close()
                    return
                channel.sock = sock
            async with trio.open_nursery() as nursery:
                channel.scope = nursery.cancel_scope
                nursery.start_soon(self._outbound, channel, send)
                nursery.start_soon(self._inbound, channel, send)
        except Exception:  # noqa: BLE001 - a socket error, or the connection going: the channel ends
            failed = not channel.done
        finally:
            channel.scope = None
        if failed:
            self.drop(channel)
            await _quietly(send, {"type": "reset", "channel": channel.id})
        elif channel.finished and not channel.done:
            self.drop(channel)

    async def _outbound(self, channel: Channel, send: Send) -> None:
        """Our socket -> the peer, within the peer's window."""
        assert channel.sock is not None
        while not channel.sent_eof:
            while channel.credit <= 0:
                await channel.changed()
            data = await channel.sock.recv(min(channel.credit, CHANNEL_DATA))
            # No checkpoint between the receive and the send: a client's send
            # is shielded from its start, so a byte received is a byte sent.
            if data:
                channel.credit -= len(data)
                await send(p.pack_chunk(channel.id, p.CHANNEL, data))
            else:
                channel.sent_eof = True
                await send({"type": "eof", "channel": channel.id})
        if channel.finished:
            channel.wake()

    async def _inbound(self, channel: Channel, send: Send) -> None:
        """The peer -> our socket, acknowledging what was written."""
        assert channel.sock is not None
        while True:
            if channel.unacked and (channel.unacked >= WINDOW // 4 or not channel.inbox):
                count, channel.unacked = channel.unacked, 0
                await send({"type": "window", "channel": channel.id, "bytes": count})
            if channel.inbox:
                written = await channel.sock.send(channel.inbox[:CHANNEL_DATA])
                del channel.inbox[:written]
                channel.unacked += written
            elif channel.peer_eof:
                if not channel.wrote_eof:
                    channel.sock.shutdown(socket.SHUT_WR)
                    channel.wrote_eof = True
                if channel.finished:
                    return
                await channel.changed()
            else:
                await channel.changed()


async def _quietly(send: Send, message: dict[str, Any]) -> None:
    try:
        await send(message)
    except Exception:  # noqa: BLE001 - the connection is going; its owner reports that
        pass
