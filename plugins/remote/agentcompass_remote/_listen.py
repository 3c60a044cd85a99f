"""Accepting connections for the sandbox server, within bounds.

From accept until its token checks out a connection is anyone's, and it holds
a descriptor and a task. So the server bounds that state three ways:

- one deadline from accept for the whole WebSocket upgrade and hello (the
  server's ``auth_timeout``), enforced by the connection's own task;
- at most ``limit`` connections in that state at once (:class:`Admission`): one
  more is closed at once, before a byte is read;
- an ``accept`` that fails for want of descriptors or kernel memory (EMFILE,
  ENFILE, ENOBUFS, ENOMEM) logs one line when it starts failing and one when it
  works again, and retries every :data:`BACKOFF_SECONDS`; the connections
  waiting meanwhile stay in the kernel's backlog. (trio's ``serve_listeners``
  logs a traceback on every retry.)

Non-goal: fairness. A cap full of silent peers refuses a real client until
their deadline frees places; the ``remote`` provider then tries another
server, or this one again later.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import NoReturn

import attrs
import trio

__all__ = ["ACCEPT_CAPACITY_ERRNOS", "BACKOFF_SECONDS", "Admission", "accept_loop", "log"]

#: accept errors that mean "no resources right now", not a broken listener.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Pause between accepts while they fail with one of those.
BACKOFF_SECONDS = 0.1

log = logging.getLogger("agentcompass_remote.server")


@attrs.define(eq=False)
class Admission:
    """Counts connections not authenticated yet, up to ``limit`` (0: no limit).

    Don't confuse it with the session capacity: this bounds strangers, the
    capacity bounds sessions."""

    limit: int
    pending: int = 0
    #: Connections closed at once because ``limit`` were pending.
    refused: int = 0

    def enter(self) -> bool:
        if self.limit and self.pending >= self.limit:
            self.refused += 1
            return False
        self.pending += 1
        return True

    def leave(self) -> None:
        self.pending -= 1


async def accept_loop(
    listener: trio.SocketListener,
    admission: Admission,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    nursery: trio.Nursery,
) -> NoReturn:
    """Accept connections on ``listener`` forever, starting ``handler(stream)``
    in ``nursery`` for each one admitted (the handler calls
    ``admission.leave()`` once, when its connection authenticates or ends)."""
    starved_since: float | None = None
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                if starved_since is None:
                    starved_since = trio.current_time()
                    log.error(
                        "accept failed: %s (%s); retrying every %ss until it works again",
                        errno.errorcode[exc.errno],
                        os.strerror(exc.errno),
                        BACKOFF_SECONDS,
                    )
                await trio.sleep(BACKOFF_SECONDS)
                continue
            if starved_since is not None:
                log.info("accepting connections again after %.1fs", trio.current_time() - starved_since)
                starved_since = None
            if not admission.enter():
                # Over the cap: hang up before reading anything.
                await trio.aclose_forcefully(stream)
                continue
            nursery.start_soon(handler, stream)
