"""The conformance kit's network policy checks: every policy accepted or rejected cleanly, and enforced when the author says where the host is."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import trio

from agentcompass.runtime import EnvironmentSession, NetworkPolicy

from ._check_helpers import CheckHelpers

__all__ = ["PolicyChecks"]


class PolicyChecks(CheckHelpers):
    """The policy checks of :class:`~agentcompass.testing.EnvironmentConformance` (a mixin)."""

    policies: Sequence[NetworkPolicy]
    host_address: Callable[[EnvironmentSession], str] | None

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
