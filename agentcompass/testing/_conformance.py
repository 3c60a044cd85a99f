"""The conformance kit for Environment providers (SPEC section 4).

A provider author runs it from an async test against their provider::

    async def test_my_provider_conforms(tmp_path):
        await check_environment(MyEnvironment({"root": str(tmp_path)}))

or lets it generate one test per check::

    test_my_provider = environment_conformance_tests(lambda: MyEnvironment({}))

Each check raises ``AssertionError`` naming the provider, the check and the
first violation. What the kit cannot verify generically, it does not claim
to. Policies are always checked to be either switched to without error or
rejected by ``build_config``; they are checked to be *enforced* only when
the author passes ``host_address``: the address at which a process inside a
session reaches the host (loopback for a provider without its own network
namespace, the host end of a veth otherwise). The kit then listens there
(never on a wildcard address) and probes it from inside with bash's
``/dev/tcp``. Leaks are checked only when the author passes
``count_sandboxes``, a probe returning how many sandboxes exist (e.g.
directories under the provider's root). ``sweep`` is checked for providers
whose ``open`` takes a ``name`` and that override ``sweep``. ``isolated``
says that commands cannot write the host's files (a provider that is no
security boundary, such as ``local``, leaves it off); file API paths must
stay confined either way.

Every provider with real processes is also held to what a hostile session
must not get, whatever its isolation: no variable of the runtime's
environment inside (``no_runtime_environment``), file operations that never
follow a link the session planted out of it (``files_never_follow_links``),
reads that refuse FIFOs and files past ``max_bytes`` without blocking
(``reads_bounded``), and commands that never run in another session
(``exec_stays_in_its_session``; with ``kill_init``, a command that kills the
session's own processes, also after it has run). With ``gateway`` (the
default for real processes) the model gateway served into a session is
held to what every harness using it relies on: an upstream echoing the key
never hands it to the session, and calls near or over the body limit leave
the runtime's memory bounded. Files are named
``/app/...``; the kit finds where commands see them.

The kit runs real sessions under the real clock; do not use
``autojump_clock`` with providers that do real I/O.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, NoReturn

import attrs
import trio
import trio.testing

from agentcompass.runtime import (
    BaseEnvironment,
    ComponentError,
    ComponentRef,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    FileRefusedError,
    NetworkPolicy,
)

from ._gateway_checks import GatewayChecks

__all__ = ["DEFAULT_POLICIES", "EnvironmentConformance", "check_environment", "environment_conformance_tests"]

#: The policies checked when none are given: one of each mode.
DEFAULT_POLICIES = (
    NetworkPolicy("none"),
    NetworkPolicy("allowlist", ("example.com",)),
    NetworkPolicy("full"),
)


@attrs.define(eq=False)
class _Opened:
    session: EnvironmentSession
    closed: bool = False


@attrs.define(eq=False)
class EnvironmentConformance(GatewayChecks):
    """Checks one provider instance against the Environment contract.

    - ``env``: the provider, built as the runtime would (``cls(config)``).
    - ``plan``: the base plan for ``build_config`` (default: task
      ``conformance``, every policy ``full``). Its baseline policy opens sessions.
    - ``policies``: the policies the policy check asks for; empty means
      :data:`DEFAULT_POLICIES`.
    - ``exec_output``: check that ``echo hi`` prints ``hi`` (turn off for
      providers that do not run commands, like ``fake-env``).
    - ``failing_config``: a config that makes ``open`` fail part-way (say, an
      image that does not exist); enables the ``close_after_failed_open`` check.
    - ``count_sandboxes``: optional probe (sync or async) returning the number
      of live sandboxes; every check then asserts it ends where it started.
    - ``grace_seconds``: the cleanup grace a close must fit in (default 30).
    - ``timeout_seconds``: a check taking longer fails as hung (default 120).
    - ``max_handle_bytes``: the largest JSON handle accepted (default 4096).
    - ``host_address``: optional ``session -> address`` at which a process in
      that session reaches the host; enables ``policy_enforced``.
    - ``real_processes``: ``exec`` runs real processes, so timeouts and
      cancellation are checked to kill a command's whole tree (default: the
      value of ``exec_output``; turn off for an in-memory provider).
    - ``isolated``: commands cannot write host files (checked by ``files_confined``).
    - ``tag``: the name prefix of the sessions the ``sweep`` check opens.
    - ``kill_init``: optional command that kills every process of the session
      (its init included: ``kill -9 -1`` in a sandbox; never give it for a
      provider whose commands run as a host user); ``exec_stays_in_its_session``
      then checks that later commands fail rather than run elsewhere.
    - ``gateway``: serve the model gateway into a session and hold it to what
      every harness using it relies on (``gateway_key_masked``,
      ``gateway_memory_bounded``; see ``_gateway_checks``; they need ``python3``
      in the session). ``None`` (the default, with real processes): checked
      where the session can expose a socket; ``True``: it must; ``False``: skipped.
    """

    env: BaseEnvironment
    plan: ExecutionPlan | None = None
    policies: Sequence[NetworkPolicy] = ()
    exec_output: bool = True
    failing_config: Any = None
    count_sandboxes: Callable[[], int | Awaitable[int]] | None = None
    grace_seconds: float = 30
    timeout_seconds: float = 120
    max_handle_bytes: int = 4096
    host_address: Callable[[EnvironmentSession], str] | None = None
    real_processes: bool = attrs.field(default=attrs.Factory(lambda self: self.exec_output, takes_self=True))
    isolated: bool = False
    tag: str = "conformance"
    kill_init: str | None = None
    gateway: bool | None = None
    _check: str = attrs.field(default="", init=False)

    CHECKS: ClassVar[tuple[str, ...]] = (
        "open_exec_handle",
        "file_round_trip",
        "close_idempotent",
        "ops_after_close_fail",
        "close_after_cancelled_open",
        "close_after_failed_open",
        "close_under_cancellation",
        "reap_after_cancelled_close",
        "policies",
        "files_confined",
        "timeout_kills_tree",
        "cancel_kills_tree",
        "policy_enforced",
        "sweep",
        "no_runtime_environment",
        "files_never_follow_links",
        "reads_bounded",
        "exec_stays_in_its_session",
        "gateway_key_masked",
        "gateway_memory_bounded",
    )

    def __attrs_post_init__(self) -> None:
        if self.plan is None:
            self.plan = ExecutionPlan("conformance", 0, ComponentRef(self.env.id, dict(self.env.config)))
        if not self.policies:
            self.policies = DEFAULT_POLICIES

    # -- running -----------------------------------------------------------

    def checks(self) -> list[str]:
        """The checks that apply with these options, in the order ``run_all`` runs them."""
        skipped = set()
        if self.failing_config is None:
            skipped.add("close_after_failed_open")
        if self.host_address is None or not self.real_processes:
            skipped.add("policy_enforced")
        if not self.real_processes:
            skipped.update(
                {
                    "timeout_kills_tree",
                    "cancel_kills_tree",
                    "no_runtime_environment",
                    "files_never_follow_links",
                    "reads_bounded",
                    "exec_stays_in_its_session",
                }
            )
        if not self._takes_name():
            skipped.add("sweep")
        if self.gateway is False or not self.real_processes:
            skipped.update({"gateway_key_masked", "gateway_memory_bounded"})
        return [c for c in self.CHECKS if c not in skipped]

    def _takes_name(self) -> bool:
        """Whether sessions are named and ``sweep`` is the provider's own (the
        base one does nothing, for providers that cannot find sandboxes by name)."""
        overrides_sweep = type(self.env).sweep is not BaseEnvironment.sweep
        return overrides_sweep and "name" in inspect.signature(self.env.open).parameters

    async def run_all(self) -> None:
        """Run every applicable check; the first violation raises ``AssertionError``."""
        for name in self.checks():
            await self.run(name)

    async def run(self, name: str) -> None:
        """Run one check by name, bounded by ``timeout_seconds``, with the leak probe around it."""
        if name not in self.CHECKS:
            raise ValueError(f"unknown check {name!r} (checks: {', '.join(self.CHECKS)})")
        self._check = name
        before = await self._count()
        try:
            with trio.fail_after(self.timeout_seconds):
                await getattr(self, f"check_{name}")()
        except trio.TooSlowError:
            self._fail(f"did not finish within {self.timeout_seconds}s: something hangs")
        after = await self._count()
        if before is not None and after is not None and after != before:
            self._fail(f"{after - before} sandbox(es) left behind (count_sandboxes went {before} -> {after})")

    # -- checks ------------------------------------------------------------

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

    async def check_policies(self) -> None:
        """Every policy is either rejected by build_config (with a ComponentError)
        or works: opened under directly, and switched to live and back."""
        base = self._plan
        for policy in self.policies:
            switch_plan = attrs.evolve(base, run_network_policy=policy)
            if self._accepts(switch_plan, f"a run policy {policy}"):
                async with self._opened(switch_plan) as box:
                    hint = "build_config accepted the plan, so it must reject plans it cannot switch"
                    await self._ok(f"set_network_policy({policy})", box.session.set_network_policy(policy), hint=hint)
                    await self._ok(
                        f"set_network_policy({base.baseline_network_policy}) (restoring the baseline)",
                        box.session.set_network_policy(base.baseline_network_policy),
                        hint=hint,
                    )
            only_plan = attrs.evolve(
                base,
                baseline_network_policy=policy,
                run_network_policy=policy,
                evaluation_network_policy=policy,
            )
            if self._accepts(only_plan, f"every phase under {policy}"):
                async with self._opened(only_plan):
                    pass

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
                    await self._raises(functools.partial(session.write_file, path, b"escaped"))
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
        found = await self._ok("exec(find /app)", session.exec(find))
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

    async def check_policy_enforced(self) -> None:
        """Under each accepted policy, a connection from inside to a listener at
        ``host_address`` succeeds exactly when the policy allows it: ``full``
        and an allowlist naming it connect; ``none`` and an allowlist of
        another address do not. Each is switched to live, in one session."""
        assert self.host_address is not None
        base = self._plan
        async with self._opened(attrs.evolve(base, baseline_network_policy=NetworkPolicy("full"))) as box:
            session = box.session
            address = self.host_address(session)
            with trio.socket.socket() as listener:
                await listener.bind((address, 0))
                listener.listen(16)
                port = listener.getsockname()[1]
                expectations = [
                    (NetworkPolicy("full"), True),
                    (NetworkPolicy("none"), False),
                    (NetworkPolicy("allowlist", (f"{address}:{port}",)), True),
                    (NetworkPolicy("allowlist", (f"{address}:{port + 1 if port < 65535 else 1}",)), False),
                ]
                for policy, reachable in expectations:
                    plan = attrs.evolve(base, run_network_policy=policy)
                    if not self._accepts(plan, f"a run policy {policy}"):
                        continue
                    await self._ok(f"set_network_policy({policy})", session.set_network_policy(policy))
                    probe = f"exec 3<>/dev/tcp/{address}/{port}"
                    result = await self._ok("exec(connect probe)", session.exec(["bash", "-c", probe], timeout=3))
                    connected = result.exit_code == 0
                    if connected != reachable:
                        self._fail(
                            f"under {policy} a connection to {address}:{port} "
                            f"{'succeeded' if connected else 'failed'} (exit {result.exit_code}, "
                            f"{result.stderr.strip()[:200]!r})"
                        )

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
                if not await self._raises(functools.partial(session.exec, "echo hi"), result) and (
                    result[0].exit_code == 0
                ):
                    self._fail(f"a session named {tag}-... still runs commands after sweep({tag!r})")
            survivor = await self._ok("exec on another session", other.exec("echo hi"))
            if survivor.exit_code != 0:
                self._fail(f"sweep({tag!r}) broke a session whose name does not start with it")
            await self._ok(f"a second sweep({tag!r})", self.env.sweep(tag), hint="sweep must be idempotent")
        finally:
            for session in [*doomed, other]:
                with trio.move_on_after(self.grace_seconds, shield=True):
                    await self._raises(session.close)

    # -- helpers -----------------------------------------------------------

    @property
    def _plan(self) -> ExecutionPlan:
        assert self.plan is not None
        return self.plan

    def _fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        raise AssertionError(
            f"environment {self.env.id!r} fails conformance check {self._check!r}: {message}"
        ) from cause

    async def _count(self) -> int | None:
        if self.count_sandboxes is None:
            return None
        count = self.count_sandboxes()
        return await count if inspect.isawaitable(count) else count

    @staticmethod
    async def _raises(call: Callable[[], Awaitable[Any]], results: list[Any] | None = None) -> bool:
        """Whether ``call()`` raised an Exception (what it returned goes to ``results``)."""
        try:
            result = await call()
        except Exception:  # noqa: BLE001 - any failure is the expected outcome
            return True
        if results is not None:
            results.append(result)
        return False

    async def _ok(self, what: str, call: Awaitable[Any], hint: str = "") -> Any:
        try:
            return await call
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"{what} raised {exc!r}" + (f"; {hint}" if hint else ""), exc)

    def _build(self, plan: ExecutionPlan | None) -> Any:
        try:
            return self.env.build_config(plan or self._plan)
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"build_config rejected the base plan ({exc!r}); pass a plan the provider accepts", exc)

    def _accepts(self, plan: ExecutionPlan, what: str) -> bool:
        try:
            self.env.build_config(plan)
        except ComponentError:
            return False
        except Exception as exc:  # noqa: BLE001 - turned into the check's failure
            self._fail(f"build_config for {what} raised {exc!r}; reject a plan with ComponentError", exc)
        return True

    @asynccontextmanager
    async def _opened(self, plan: ExecutionPlan | None = None) -> AsyncIterator[_Opened]:
        """A session under the plan's baseline policy, closed on the way out
        unless the check closed it (``box.closed``)."""
        plan = plan or self._plan
        config = self._build(plan)
        policy = plan.baseline_network_policy
        session = await self._ok(f"open(config, {policy})", self.env.open(config, policy))
        box = _Opened(session)
        try:
            yield box
        except BaseException:
            if not box.closed:
                # The check's own failure is the one to report, not this close's.
                with trio.move_on_after(self.grace_seconds, shield=True):
                    await self._raises(session.close)
            raise
        if not box.closed:
            await self._close_checked(session)

    async def _close_checked(self, session: EnvironmentSession, what: str = "close()") -> None:
        with trio.move_on_after(self.grace_seconds, shield=True) as grace:
            await self._ok(what, session.close())
        if grace.cancelled_caught:
            self._fail(f"{what} did not finish within the {self.grace_seconds}s grace")

    async def _still_works(self, when: str) -> None:
        async with self._opened() as box:
            result = await self._ok(f"exec('echo hi') {when}", box.session.exec("echo hi"))
            if getattr(result, "exit_code", None) != 0:
                self._fail(f"exec('echo hi') {when} returned {result!r}")


async def check_environment(
    env: BaseEnvironment,
    plan: ExecutionPlan | None = None,
    *,
    policies: Sequence[NetworkPolicy] = (),
    **options: Any,
) -> None:
    """Run every conformance check against ``env``; raise ``AssertionError`` on
    the first violation. ``options`` are the other :class:`EnvironmentConformance`
    fields (``exec_output``, ``failing_config``, ``count_sandboxes``, ...)."""
    await EnvironmentConformance(env, plan, policies, **options).run_all()


def environment_conformance_tests(make_env: Callable[[], BaseEnvironment], **options: Any) -> Any:
    """A pytest-trio test function parametrized over the checks, one test per check.

    Assign it to a ``test_*`` name in a test module::

        test_local_conformance = environment_conformance_tests(lambda: LocalEnvironment({}))

    ``make_env`` is called once per check; ``options`` go to
    :class:`EnvironmentConformance`. Checks that do not apply are skipped.
    """
    import pytest  # only a test dependency, so imported when used

    async def test_environment_conformance(check: str) -> None:
        kit = EnvironmentConformance(make_env(), **options)
        if check not in kit.checks():
            pytest.skip(f"check {check!r} needs an option that was not given")
        await kit.run(check)

    return pytest.mark.parametrize("check", EnvironmentConformance.CHECKS)(test_environment_conformance)
