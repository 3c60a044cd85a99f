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

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import attrs
import trio

from agentcompass.runtime import (
    BaseEnvironment,
    ComponentRef,
    EnvironmentSession,
    ExecutionPlan,
    NetworkPolicy,
)

from ._gateway_checks import GatewayChecks
from ._hostile_checks import HostileSessionChecks
from ._lifecycle_checks import LifecycleChecks
from ._policy_checks import PolicyChecks

__all__ = ["DEFAULT_POLICIES", "EnvironmentConformance", "check_environment", "environment_conformance_tests"]

#: The policies checked when none are given: one of each mode.
DEFAULT_POLICIES = (
    NetworkPolicy("none"),
    NetworkPolicy("allowlist", ("example.com",)),
    NetworkPolicy("full"),
)


@attrs.define(eq=False)
class EnvironmentConformance(LifecycleChecks, PolicyChecks, HostileSessionChecks, GatewayChecks):
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
