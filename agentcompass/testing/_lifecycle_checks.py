"""The conformance kit's lifecycle checks: open, exec, files, then close, reap and sweep, also when cancelled part-way."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
import trio.testing

from agentcompass.runtime import EnvironmentSession, ExecResult

from ._check_helpers import CheckHelpers

__all__ = ["LifecycleChecks"]


class LifecycleChecks(CheckHelpers):
    """The lifecycle checks of :class:`~agentcompass.testing.EnvironmentConformance` (a mixin)."""

    exec_output: bool
    max_handle_bytes: int
    failing_config: Any
    tag: str

    async def check_open_exec_handle(self) -> None:
        """open works; exec of a string and of an argv list works; the handle is
        a small dict that survives a JSON round trip (``reap`` gets the decoded copy)."""
        async with self._opened() as box:
            session = box.session
            if not isinstance(session, EnvironmentSession):
                self._fail(f"open() returned {type(session).__name__}, not an EnvironmentSession")
            for cmd in ("echo hi", ["echo", "hi"]):
                result = await self._ok(f"exec({cmd!r})", session.exec(cmd))
                if not isinstance(result, ExecResult):
                    self._fail(f"exec({cmd!r}) returned {type(result).__name__}, not an ExecResult")
                if result.exit_code != 0:
                    self._fail(f"exec({cmd!r}) exited {result.exit_code}: {result.stderr[:200]!r}")
                if self.exec_output and "hi" not in result.stdout:
                    self._fail(f"exec({cmd!r}) printed {result.stdout[:200]!r}, expected 'hi'")
            await self._check_exec_stream(session)
            handle = session.handle
            if not isinstance(handle, dict):
                self._fail(f"handle is a {type(handle).__name__}, not a dict")
            try:
                encoded = json.dumps(handle)
            except (TypeError, ValueError) as exc:
                self._fail(f"handle {handle!r} is not JSON-serializable: {exc}")
            if json.loads(encoded) != handle:
                self._fail(f"handle {handle!r} changes in a JSON round trip; use only str, int, float, bool, lists")
            if len(encoded.encode()) > self.max_handle_bytes:
                self._fail(f"handle is {len(encoded.encode())} bytes of JSON; keep it under {self.max_handle_bytes}")

    async def _check_exec_stream(self, session: EnvironmentSession) -> None:
        """exec_stream hands the output to its callback and returns empty text."""
        chunks: list[tuple[str, bytes]] = []

        async def on_output(stream: str, chunk: bytes) -> None:
            chunks.append((stream, bytes(chunk)))

        what = "exec_stream('echo hi')"
        result = await self._ok(what, session.exec_stream("echo hi", on_output=on_output))
        if not isinstance(result, ExecResult) or result.exit_code != 0:
            self._fail(f"{what} returned {result!r}, expected an ExecResult with exit_code 0")
        if result.stdout or result.stderr:
            self._fail(f"{what} returned output in its result; it belongs to on_output only")
        if any(stream not in ("stdout", "stderr") for stream, _ in chunks):
            self._fail(f"{what} called on_output with streams {sorted({s for s, _ in chunks})}")
        stdout = b"".join(chunk for stream, chunk in chunks if stream == "stdout")
        if self.exec_output and b"hi" not in stdout:
            self._fail(f"{what} streamed {stdout[:200]!r} to stdout, expected 'hi'")

    async def check_file_round_trip(self) -> None:
        """write_file then read_file returns the same bytes (str is written as UTF-8)."""
        async with self._opened() as box:
            session = box.session
            cases: list[tuple[bytes | str, bytes]] = [
                (b"bin\x00\xff\n", b"bin\x00\xff\n"),
                ("text \u00e9\n", "text \u00e9\n".encode()),
            ]
            for data, expected in cases:
                path = "agentcompass-conformance.txt"
                await self._ok(f"write_file({path!r}, {data!r})", session.write_file(path, data))
                got = await self._ok(f"read_file({path!r})", session.read_file(path))
                if got != expected:
                    self._fail(f"wrote {data!r} to {path!r} but read back {got!r} (read_file must return bytes)")

    async def check_close_idempotent(self) -> None:
        """A second close() is a no-op, not an error."""
        async with self._opened() as box:
            await self._ok("close()", box.session.close())
            box.closed = True
            await self._ok("a second close()", box.session.close(), hint="close() must be idempotent")

    async def check_ops_after_close_fail(self) -> None:
        """exec and write_file on a closed session raise (and recreate nothing)."""
        async with self._opened() as box:
            session = box.session
            await self._ok("close()", session.close())
            box.closed = True
            calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("exec('echo hi')", lambda: session.exec("echo hi")),
                ("write_file('after-close.txt')", lambda: session.write_file("after-close.txt", b"x")),
            ]
            for what, call in calls:
                if not await self._raises(call):
                    self._fail(f"{what} after close() succeeded; operations on a closed session must raise")

    async def check_close_after_cancelled_open(self) -> None:
        """An open cancelled before it starts, and one cancelled at its first
        blocking point, lets ``Cancelled`` through (or returns a session that
        closes cleanly) and leaves the provider usable.

        "Its first blocking point" is found without knowing the provider: the
        open runs in a child task and is cancelled once every task is blocked
        (``trio.testing.wait_all_tasks_blocked``): waiting on a process, a
        socket or a thread, i.e. part-way through a real open.
        """
        config = self._build(self.plan)
        policy = self._plan.baseline_network_policy
        with trio.CancelScope() as scope:
            scope.cancel()
            session = await self._ok(
                "open() in a cancelled scope", self.env.open(config, policy), hint="let Cancelled propagate"
            )
        if not scope.cancelled_caught:
            # It finished without a checkpoint: legal, but the session is ours to close.
            await self._close_checked(session)

        opened: list[EnvironmentSession] = []

        async def open_until_cancelled(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as child_scope:
                task_status.started(child_scope)
                opened.append(await self.env.open(config, policy))

        # Raising from inside except* would wrap our AssertionError in a group.
        failure: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                child_scope = await nursery.start(open_until_cancelled)
                await trio.testing.wait_all_tasks_blocked()
                child_scope.cancel()
        except* Exception as group:  # noqa: BLE001 - any provider error is the finding
            failure = group.exceptions[0]
        for session in opened:
            await self._close_checked(session)
        if failure is not None:
            self._fail(f"open() cancelled part-way raised {failure!r} instead of letting Cancelled through", failure)
        await self._still_works("after a cancelled open")

    async def check_close_after_failed_open(self) -> None:
        """open(failing_config) raises, cleans up what it made, and the provider still works."""
        policy = self._plan.baseline_network_policy
        opened: list[EnvironmentSession] = []
        if not await self._raises(lambda: self.env.open(self.failing_config, policy), opened):
            await self._close_checked(opened[0])
            self._fail(f"open({self.failing_config!r}) succeeded; failing_config must make open fail")
        await self._still_works("after a failed open")

    async def check_close_under_cancellation(self) -> None:
        """close() called from cleanup code of a cancelled scope (shielded, bounded by
        the grace) finishes within the grace; reap(handle) afterwards, twice, is harmless."""
        async with self._opened() as box:
            handle = json.loads(json.dumps(box.session.handle))
            with trio.CancelScope() as cancelled:
                cancelled.cancel()
                with trio.move_on_after(self.grace_seconds, shield=True) as grace:
                    await self._ok("close() in a shielded cleanup scope", box.session.close())
            box.closed = True
            if grace.cancelled_caught:
                self._fail(f"close() under cancellation did not finish within the {self.grace_seconds}s grace")
            for what in ("reap(handle) after close()", "a second reap(handle)"):
                await self._ok(what, self.env.reap(handle), hint="reap must be idempotent")

    async def check_reap_after_cancelled_close(self) -> None:
        """A close() cancelled at its first blocking point (the grace ran out)
        may leave the sandbox, but another close() does not raise and
        reap(handle) destroys it (verified by ``count_sandboxes`` when given)."""
        async with self._opened() as box:
            session = box.session
            handle = json.loads(json.dumps(session.handle))
            box.closed = True
            failure: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.close)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.cancel_scope.cancel()
            except* Exception as group:  # noqa: BLE001 - any provider error is the finding
                failure = group.exceptions[0]
            if failure is not None:
                self._fail(
                    f"close() cancelled part-way raised {failure!r} instead of letting Cancelled through",
                    failure,
                )
            await self._close_checked(session, "close() after a cancelled close()")
            await self._ok("reap(handle) after a cancelled close()", self.env.reap(handle))

    async def check_sweep(self) -> None:
        """sweep(tag) destroys every session whose name starts with the tag
        (its operations then fail), leaves other sessions alone, and is idempotent."""
        tag = f"{self.tag}-{secrets.token_hex(3)}"
        config = self._build(self._plan)
        policy = self._plan.baseline_network_policy
        doomed = [
            await self._ok(f"open(..., name={tag}-{i})", self.env.open(config, policy, name=f"{tag}-{i}"))
            for i in range(2)
        ]
        other = await self._ok("open(..., name=other)", self.env.open(config, policy, name=f"x{tag}"))
        try:
            await self._ok(f"sweep({tag!r})", self.env.sweep(tag))
            for session in doomed:
                result: list[Any] = []
                if not await self._raises(partial(session.exec, "echo hi"), result) and (result[0].exit_code == 0):
                    self._fail(f"a session named {tag}-... still runs commands after sweep({tag!r})")
            survivor = await self._ok("exec on another session", other.exec("echo hi"))
            if survivor.exit_code != 0:
                self._fail(f"sweep({tag!r}) broke a session whose name does not start with it")
            await self._ok(f"a second sweep({tag!r})", self.env.sweep(tag), hint="sweep must be idempotent")
        finally:
            for session in [*doomed, other]:
                with trio.move_on_after(self.grace_seconds, shield=True):
                    await self._raises(session.close)
