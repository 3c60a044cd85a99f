"""Lifecycle of sandbox sessions: cancellation anywhere inside open, reap by
handle, sweep by tag, and the conformance kit."""

from __future__ import annotations

import json
import os

import pytest
import trio
import trio.testing
from _common import poll_until
from _sandbox_support import census, requires_sandbox, veths
from agentcompass_sandbox import SandboxEnvironment, SandboxSession, _host

from agentcompass import IssueError, NetworkPolicy
from agentcompass.testing import check_environment, hang_guard

pytestmark = requires_sandbox
FULL = NetworkPolicy("full")


class _CancelAtCheckpoint(trio.abc.Instrument):
    """Cancels a scope at the n-th time the watched task is scheduled."""

    def __init__(self, n: int):
        self.n = n
        self.seen = 0
        self.task: trio.lowlevel.Task | None = None
        self.scope: trio.CancelScope | None = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self.scope is not None:
            self.seen += 1
            if self.seen == self.n:
                self.scope.cancel()


async def _open_one(
    provider: SandboxEnvironment, name: str, instrument: _CancelAtCheckpoint, opened: list[SandboxSession]
) -> None:
    instrument.task = trio.lowlevel.current_task()
    with trio.CancelScope() as scope:
        instrument.scope = scope
        opened.append(await provider.open(None, FULL, name))


async def test_open_cancelled_at_every_step_leaves_nothing(provider: SandboxEnvironment, tag: str) -> None:
    """Cancel an open under ``full`` at its 1st, 2nd, ... scheduling point until
    one completes: every cancelled open cleaned up all it had made."""
    with hang_guard(120):
        for n in range(1, 200):
            name = f"{tag}-{n}"
            instrument = _CancelAtCheckpoint(n)
            opened: list[SandboxSession] = []
            trio.lowlevel.add_instrument(instrument)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_open_one, provider, name, instrument, opened)
            finally:
                trio.lowlevel.remove_instrument(instrument)
            if opened:
                await opened[0].close()
                assert await census(tag) == []
                break
            assert await census(name) == [], f"cancelled at step {n}"
        else:
            pytest.fail("open never completed")
        assert n > 5  # it really was cancelled part-way many times


async def test_reap_destroys_what_a_killed_runtime_left(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        # Opened offline, then given egress: the veth and its lease are the session's own.
        session = await provider.open(None, NetworkPolicy("none"), f"{tag}-a")
        await session.set_network_policy(FULL)
        handle = json.loads(json.dumps(session.handle))
        await session.exec("sleep 600 > /dev/null 2>&1 &")
        assert _host.veth_name(session.name) in veths()
        # What a SIGKILL leaves: the state directory, cgroups, veth, lease and processes.
        assert len(await census(tag)) >= 4
        await provider.reap(handle)
        assert await census(tag) == []
        assert _host.veth_name(session.name) not in veths()
        await provider.reap(handle)  # idempotent
        with pytest.raises(IssueError, match="not a sandbox handle"):
            await provider.reap({"path": "/"})
        await session.close()  # the session object copes with it too


async def test_sweep_destroys_sessions_by_prefix_only(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        mine = [await provider.open(None, FULL, f"{tag}-{i}") for i in range(3)]
        other = await provider.open(None, FULL, f"x{tag}")
        try:
            await provider.sweep(tag)
            assert await census(tag) == []
            assert (await other.exec("echo alive")).stdout == "alive\n"
            await provider.sweep(tag)
            # A half-made session (directory and cgroup only, as after a kill inside open).
            await trio.to_thread.run_sync(_host.make_session_dir, f"{tag}-half", 1 << 20)
            await trio.to_thread.run_sync(_host.make_cgroups, f"{tag}-half", None, None)
            assert await census(tag)
            await provider.sweep(tag)
            assert await census(tag) == []
        finally:
            for session in mine:
                await session.close()
            await other.close()
        assert await census(f"x{tag}") == []


async def test_close_under_cancellation_finishes_within_its_shield(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(30):
        session = await provider.open(None, FULL, f"{tag}-a")
        await session.exec("sleep 600 > /dev/null 2>&1 &")
        with trio.CancelScope() as scope:
            scope.cancel()
            with trio.move_on_after(10, shield=True) as grace:
                await session.close()
        assert not grace.cancelled_caught
        assert await census(tag) == []


@pytest.mark.serial  # its leak probe counts every sandbox on the host
async def test_the_sandbox_provider_conforms(tag: str) -> None:
    def count() -> int:
        root = _host.STATE_ROOT
        return len([e for e in os.listdir(root) if not e.startswith(".")]) if root.is_dir() else 0

    env = SandboxEnvironment({})
    with hang_guard(240):
        try:
            await check_environment(
                env,
                count_sandboxes=count,
                host_address=lambda session: session.addresses[0],
                isolated=True,
                tag=tag,
                kill_init="kill -9 -1",
                # Literal addresses: this host may have no DNS (names are resolved at the switch).
                policies=[NetworkPolicy("none"), NetworkPolicy("allowlist", ("127.0.0.1:9",)), FULL],
            )
        finally:
            await env.sweep(tag)


async def test_opening_a_name_in_use_fails_and_leaves_the_other_session_alone(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(30):
        first = await provider.open(None, FULL, f"{tag}-a")
        try:
            with pytest.raises(IssueError, match="already exists"):
                await provider.open(None, FULL, f"{tag}-a")
            assert (await first.exec("echo alive")).stdout == "alive\n"
        finally:
            await first.close()


async def test_a_session_outlives_the_worker_thread_that_spawned_it(provider: SandboxEnvironment, tag: str) -> None:
    """Trio spawns processes from worker threads, which exit once idle; a
    parent-death signal bound to that thread would kill the sandbox then."""
    import threading

    with hang_guard(60):
        session = await provider.open(None, FULL, f"{tag}-a")
        try:
            before = await session.exec("sleep 600 > /dev/null 2>&1 & echo started")
            assert before.stdout == "started\n"
            # Trio's idle worker threads exit on their own timer: nothing to wait on.
            # (Only Trio's: other threads of the test process, a Ray driver's, stay.)
            await poll_until(
                lambda: not any(t.name.startswith("Trio thread") for t in threading.enumerate()),
                "Trio's idle worker threads to exit",
                30,
                every=0.1,
            )
            after = await session.exec("pgrep -x sleep > /dev/null && echo still-here")
            assert after.stdout == "still-here\n", after
        finally:
            await session.close()
