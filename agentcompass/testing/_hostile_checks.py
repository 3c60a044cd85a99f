"""The conformance kit's hostile-session checks: what a session must never get from the host or another session, whatever its isolation."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Awaitable
from functools import partial
from typing import Any

import trio

from agentcompass.runtime import EnvironmentSession, ExecResult, FileRefusedError

from ._check_helpers import CheckHelpers

__all__ = ["HostileSessionChecks"]


class HostileSessionChecks(CheckHelpers):
    """The hostile-session checks of :class:`~agentcompass.testing.EnvironmentConformance` (a mixin)."""

    isolated: bool
    kill_init: str | None

    async def check_files_confined(self) -> None:
        """write_file/read_file of a path outside the sandbox (``..`` or an
        absolute host path) raise or stay inside: the host file never appears.
        With ``isolated``, a command writing that host path does not reach it either."""
        target = os.path.join(tempfile.gettempdir(), f"agentcompass-conformance-{secrets.token_hex(6)}")
        host_file = trio.Path(target)
        escapes = [target, "../" * 32 + target.lstrip("/")]
        try:
            async with self._opened() as box:
                session = box.session
                for path in escapes:
                    await self._raises(partial(session.write_file, path, b"escaped"))
                    if await host_file.exists():
                        self._fail(f"write_file({path!r}) wrote the host file {target}")
                if self.isolated:
                    await self._ok("exec(write a host path)", session.exec(f"echo escaped > {target}"))
                    if await host_file.exists():
                        self._fail(f"a command inside wrote the host file {target}")
        finally:
            with trio.move_on_after(self.grace_seconds, shield=True):
                await host_file.unlink(missing_ok=True)

    async def _app_dir(self, session: EnvironmentSession) -> str:
        """Where a command finds what ``write_file('/app/...')`` wrote (the
        command and file API may name the directory differently)."""
        probe = f"ac-probe-{secrets.token_hex(4)}"
        await self._ok(f"write_file('/app/{probe}')", session.write_file(f"/app/{probe}", b"probe"))
        find = (
            f'p=$(pwd); for d in "${{APP_DIR:-}}" "$p" "$p/app" /app; do '
            f'if [ -n "$d" ] && [ -e "$d/{probe}" ]; then echo "$d"; exit 0; fi; done; exit 1'
        )
        found: ExecResult = await self._ok("exec(find /app)", session.exec(find))
        if found.exit_code != 0 or not found.stdout.strip():
            self._fail(
                f"a command finds no {probe} written by write_file('/app/{probe}') (tried $APP_DIR, ., ./app, /app)"
            )
        return found.stdout.strip().splitlines()[-1]

    async def check_no_runtime_environment(self) -> None:
        """No process of a session sees a variable of the runtime's environment:
        not in its own environment, not in any ``/proc/<pid>/environ`` it can read."""
        name = f"AGENTCOMPASS_CONFORMANCE_SECRET_{secrets.token_hex(4).upper()}"
        value = f"sk-{secrets.token_hex(16)}"
        os.environ[name] = value
        try:
            async with self._opened() as box:
                cmd = "env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null"
                result = await self._ok("exec(env and every readable environ)", box.session.exec(cmd))
                if value in result.stdout or name in result.stdout:
                    self._fail(
                        f"a process inside sees the runtime's variable {name} (start sessions from an empty environment)"
                    )
        finally:
            del os.environ[name]

    async def check_files_never_follow_links(self) -> None:
        """Links planted by a command inside, to a host file and to a host
        directory, are never followed by read_file or write_file: the host
        file is neither read nor changed, nothing appears in the host directory."""
        host_dir = trio.Path(tempfile.mkdtemp(prefix="agentcompass-conformance-"))
        host_file = host_dir / "secret"
        await host_file.write_bytes(b"HOST SECRET")
        try:
            async with self._opened() as box:
                session = box.session
                app = await self._app_dir(session)
                plant = f"ln -s {host_file} '{app}/ac-file-link' && ln -s {host_dir} '{app}/ac-dir-link'"
                planted = await self._ok("exec(ln -s ...)", session.exec(plant))
                if planted.exit_code != 0:
                    self._fail(f"could not plant links inside: {planted.stderr[:200]!r}")
                for path in ("/app/ac-file-link", "/app/ac-dir-link/secret"):
                    try:
                        got = await session.read_file(path)
                    except Exception:  # noqa: BLE001 - any refusal will do
                        continue
                    if got == b"HOST SECRET":
                        self._fail(f"read_file({path!r}) followed a link the session planted to a host file")
                for path in ("/app/ac-file-link", "/app/ac-dir-link/new"):
                    try:
                        await session.write_file(path, b"written")
                    except Exception:  # noqa: BLE001 - any refusal will do
                        pass
                if await host_file.read_bytes() != b"HOST SECRET":
                    self._fail("write_file followed a link the session planted and changed a host file")
                if sorted(os.listdir(host_dir)) != ["secret"]:
                    self._fail("write_file followed a link the session planted into a host directory")
        finally:
            with trio.move_on_after(self.grace_seconds, shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, host_dir, True)

    async def check_reads_bounded(self) -> None:
        """read_file of a FIFO the session made raises FileRefusedError at once
        (it never waits for a writer), and a file longer than ``max_bytes`` is
        refused while one within it is read whole."""
        async with self._opened() as box:
            session = box.session
            made = await self._ok(
                "exec(mkfifo ...)",
                session.exec(
                    f"cd '{await self._app_dir(session)}' && mkfifo ac-fifo && head -c 2048 /dev/zero > ac-2k"
                ),
            )
            if made.exit_code != 0:
                self._fail(f"could not make a FIFO inside: {made.stderr[:200]!r}")
            with trio.move_on_after(5) as bound:
                await self._refused("read_file('/app/ac-fifo')", session.read_file("/app/ac-fifo"))
                await self._refused(
                    "read_file('/app/ac-2k', max_bytes=1024)", session.read_file("/app/ac-2k", max_bytes=1024)
                )
            if bound.cancelled_caught:
                self._fail("read_file of a FIFO blocked (open files without blocking and refuse what is not regular)")
            got = await self._ok(
                "read_file('/app/ac-2k', max_bytes=4096)", session.read_file("/app/ac-2k", max_bytes=4096)
            )
            if len(got) != 2048:
                self._fail(f"read_file within max_bytes returned {len(got)} bytes, expected 2048")

    async def _refused(self, what: str, call: Awaitable[Any]) -> None:
        try:
            await call
        except FileRefusedError:
            return
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"{what} raised {exc!r}, expected FileRefusedError", exc)
        self._fail(f"{what} returned instead of raising FileRefusedError")

    async def check_exec_stays_in_its_session(self) -> None:
        """A command of one session never sees or changes another's files; with
        ``kill_init``, neither does one run after the session killed its own processes."""
        async with self._opened() as first_box, self._opened() as second_box:
            first, second = first_box.session, second_box.session
            marker = f"ac-theirs-{secrets.token_hex(4)}"
            await self._ok("write_file", second.write_file(f"/app/{marker}", b"second's"))
            # Where the first's commands see their own files: the second's file
            # shows there only if a command of the first runs in the second.
            app = await self._app_dir(first)
            probe = f"cat '{app}/{marker}'; touch '{app}/ac-planted'"
            for when in ("", " after kill_init"):
                if when:
                    if self.kill_init is None:
                        break
                    with trio.move_on_after(self.grace_seconds):
                        await self._ok(f"exec({self.kill_init!r})", first.exec(self.kill_init))
                try:
                    result = await first.exec(probe)
                except Exception:  # noqa: BLE001 - failing to run at all is fine
                    continue
                if "second's" in result.stdout:
                    self._fail(f"a command of one session read another session's file{when}")
                try:
                    await second.read_file("/app/ac-planted")
                except FileNotFoundError:
                    continue
                self._fail(f"a command of one session created a file in another session{when}")

    async def check_timeout_kills_tree(self) -> None:
        """exec at its timeout returns ``timed_out=True`` promptly and kills the
        command's whole tree: a background child that would write a file later never does."""
        async with self._opened() as box:
            session = box.session
            cmd = "(sleep 1; echo late > agentcompass-late.txt) & sleep 30"
            with trio.move_on_after(self.grace_seconds) as bound:
                result = await self._ok("exec(cmd, timeout=0.3)", session.exec(cmd, timeout=0.3))
            if bound.cancelled_caught:
                self._fail(f"exec with timeout=0.3 did not return within {self.grace_seconds}s")
            if not result.timed_out:
                self._fail(f"exec past its timeout returned timed_out=False: {result!r}")
            await self._child_never_wrote(session, "the timeout")

    async def check_cancel_kills_tree(self) -> None:
        """A cancelled exec lets ``Cancelled`` through and kills its whole tree."""
        async with self._opened() as box:
            session = box.session
            cmd = "(sleep 1; echo late > agentcompass-late.txt) & sleep 30"
            with trio.move_on_after(0.3) as scope:
                await self._ok("exec(cmd)", session.exec(cmd))
            if not scope.cancelled_caught:
                self._fail("exec('... sleep 30') returned before it was cancelled")
            await self._child_never_wrote(session, "the cancellation")

    async def _child_never_wrote(self, session: EnvironmentSession, what: str) -> None:
        await trio.sleep(1.5)
        late = await self._ok("exec(test -e)", session.exec("test -e agentcompass-late.txt"))
        if late.exit_code == 0:
            self._fail(f"a background child of the command outlived {what} (it wrote its file later)")
