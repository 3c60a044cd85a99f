"""The provider limits the driver grants its workers' tasks from: a worker asks
for a capacity permit or an open-rate token, the driver waits on its own
limiter (or grants at once what is free) and answers ``Granted``."""

from __future__ import annotations

import attrs
import trio

from .._limits import provider_limits
from ..runtime._executor import Grants
from ._link import Link
from ._messages import Abandon, AcquireCapacity, Granted, OpenToken, Release

__all__ = ["GrantDesk"]


@attrs.define(eq=False)
class GrantDesk:
    """Answers the workers' grant requests from ``grants``, the run's (set by
    ``RayExecutor.run_task``); ``nursery`` holds the waits not answered at once."""

    grants: Grants | None = None
    nursery: trio.Nursery | None = None

    async def ask(self, link: Link, message: AcquireCapacity | OpenToken) -> None:
        if not self._grant_now(link, message):
            assert self.nursery is not None
            self.nursery.start_soon(self._grant, link, message)

    async def abandon(self, link: Link, message: Abandon) -> None:
        if message.grant in link.granting:
            link.granting[message.grant].cancel()
        else:
            self.give_back(link, message.grant)

    async def release(self, link: Link, message: Release) -> None:
        self.give_back(link, message.grant)

    async def _grant(self, link: Link, message: AcquireCapacity | OpenToken) -> None:
        grants = self.grants
        assert grants is not None
        grant = message.grant
        holder = (link.index, grant)
        with trio.CancelScope() as scope:
            link.granting[grant] = scope
            try:
                if isinstance(message, AcquireCapacity):
                    await grants.acquire_capacity(message.provider, holder)
                    link.held[grant] = (message.provider, holder)
                else:
                    await grants.open_token(message.provider)
            finally:
                link.granting.pop(grant, None)
            if link.alive:
                link.send(Granted(grant))
            else:
                self.give_back(link, grant)

    def _grant_now(self, link: Link, message: AcquireCapacity | OpenToken) -> bool:
        """Grant at once what is free (a permit nobody queues for, a token of
        an unlimited open rate), without a task per grant; False: wait for it."""
        registry = provider_limits()
        grant, provider = message.grant, message.provider
        if isinstance(message, AcquireCapacity):
            holder = (link.index, grant)
            try:
                registry.capacity(provider).acquire_on_behalf_of_nowait(holder)
            except trio.WouldBlock:
                return False
            link.held[grant] = (provider, holder)
        elif registry.open_rate_bucket(provider) is not None:
            return False
        link.send(Granted(grant))
        return True

    def give_back(self, link: Link, grant: int) -> None:
        held = link.held.pop(grant, None)
        if held is not None and self.grants is not None:
            self.grants.release_capacity(*held)

    def give_back_all(self, link: Link) -> None:
        """A lost worker's waits end and its permits go back."""
        for scope in list(link.granting.values()):
            scope.cancel()
        for grant in list(link.held):
            self.give_back(link, grant)
