"""Invariants of the attempt engine over random fault schedules, and strict
cancellation at every checkpoint an attempt passes."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from _support import make_context, make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompass import register
from agentcompass._orchestration._task import run_task
from agentcompass.testing import FakeHarness, call_log, reset_logs

ACTIONS = st.sampled_from(["ok", "ok", "ok", "fatal", "error", "error:flaky", "warning", "raise", "hang"])
PHASES = {
    "env": ["open", "set_network_policy", "close"],
    "bench": ["prepare", "collect", "evaluate"],
    "harness": ["start_session", "run", "close_session"],
}


def scripts():
    return st.fixed_dictionaries(
        {
            component: st.dictionaries(st.sampled_from(phases), st.lists(ACTIONS, max_size=4), max_size=len(phases))
            for component, phases in PHASES.items()
        }
    )


POLICIES = st.sampled_from([None, {"mode": "none"}, {"mode": "allowlist", "allow": ["a.example"]}])


def _started_harness_sessions(log):
    """start_session calls that returned a session (their action succeeded)."""
    return sum(1 for c in log.select("start_session") if c.detail["action"] in ("ok", "warning"))


def _failure_phases(issues):
    return {i.phase for i in issues if i.severity != "warning"}


def _expected_status(issues):
    phases = _failure_phases(issues)
    run = bool(phases & {"setup", "run", "collect"})
    evaluate = "evaluate" in phases
    return {(True, True): "run_error_or_eval_error", (True, False): "run_error", (False, True): "eval_error"}.get(
        (run, evaluate), "completed"
    )


def _run_case(script, mode, max_retries, k, strategy, keep, run_policy, eval_policy, cancel_at):
    reset_logs()
    plan = {"evaluation_environment_mode": mode}
    if run_policy:
        plan["run_network_policy"] = run_policy
    if eval_policy:
        plan["evaluation_network_policy"] = eval_policy
    request = make_request(
        k=k,
        strategy=strategy,
        bench={"plan": plan, "script": {"*": script["bench"]}, "values": {"*": {"score": [0.0, 1.0]}}},
        env={"script": {"*": script["env"]}},
        harness={"script": {"*": script["harness"]}},
        max_retries=max_retries,
        retry_pattern_list=["flaky"],
        retry_min_delay_seconds=1,
        retry_max_delay_seconds=4,
        setup_timeout_seconds=5,
        run_timeout_seconds=5,
        run_timer_compensation_seconds=1,
        evaluation_timeout_seconds=5,
        keep_environment=keep,
    )
    seen = {}

    async def main():
        ctx, reporter, grants = make_context(request, grace=3)
        reporter.on_event = lambda kind, fields: seen.setdefault("times", []).append((kind, trio.current_time()))
        task = (await ctx.benchmark.load_tasks(request))[0]
        start = trio.current_time()
        record = None
        with trio.CancelScope() as scope:
            if cancel_at is not None:
                scope.deadline = start + cancel_at
            record = await run_task(ctx, task, list(range(k)))
        return record, scope, reporter, grants, start

    record, scope, reporter, grants, start = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    log = call_log("t")

    # Every opened session is closed exactly once (or kept), never by two closes.
    opened = log.opened_sessions()
    if keep:
        assert log.close_calls() == {}
    else:
        assert log.closed_sessions() == {s: 1 for s in opened}
        assert log.close_calls() == {s: 1 for s in opened}
        # The journal leaves open exactly the sessions whose close did not
        # finish (failed or overran the grace): those a reap must destroy.
        journal_open = set(reporter.opened) - set(reporter.closed)
        assert len(journal_open) == len(log.live_sessions())
    assert not grants.held

    # Innermost first: a harness session closes before its environment, and
    # no session opens while another of the same task is still open.
    live = set()
    for call in log.calls:
        if call.phase == "opened":
            assert keep or not live, f"session {call.session} opened while {live} still open"
            live.add(call.session)
        elif call.phase == "close":
            live.discard(call.session)
        elif call.phase == "close_session":
            assert call.session in live or keep
    assert _started_harness_sessions(log) == log.count("close_session")

    if scope.cancelled_caught:
        # Cancellation propagates, is never retried, and nothing starts after it.
        assert record is None
        cancel_time = start + cancel_at
        assert all(t <= cancel_time for kind, t in seen.get("times", []) if kind in ("attempt_started", "attempt_retry"))
        return
    assert record is not None
    starts: dict[int, int] = {}
    for kind, fields in reporter.events:
        if kind == "attempt_started":
            starts[fields["attempt"]] = starts.get(fields["attempt"], 0) + 1
    for attempt in record.attempts:
        assert attempt.retries <= max_retries
        assert starts[attempt.attempt] == attempt.retries + 1
        assert attempt.status == _expected_status(attempt.issues)
    all_issues = [i for a in record.attempts for i in a.issues]
    severities = {i.severity for i in all_issues}
    expected = "fatal" if "fatal" in severities else "error" if "error" in severities else "normal"
    assert record.severity == expected
    # A FATAL left stops the task; otherwise avg runs every attempt.
    if strategy == "avg" and expected != "fatal":
        assert len(record.attempts) == k


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=scripts(),
    mode=st.sampled_from(["reuse", "none", "fresh"]),
    max_retries=st.integers(0, 3),
    k=st.integers(1, 3),
    strategy=st.sampled_from(["avg", "pass"]),
    keep=st.booleans().filter(lambda _: True),
    run_policy=POLICIES,
    eval_policy=POLICIES,
    cancel_at=st.one_of(st.none(), st.floats(0, 80, allow_nan=False)),
)
def test_attempt_invariants_over_fault_schedules(
    script, mode, max_retries, k, strategy, keep, run_policy, eval_policy, cancel_at
):
    _run_case(script, mode, max_retries, k, strategy, keep, run_policy, eval_policy, cancel_at)


# -- cancellation at every checkpoint ---------------------------------------------


LIVE_HARNESS_SESSIONS: set[int] = set()


@register
class TrackingHarness(FakeHarness):
    """fake-harness that knows which sessions it handed out and got back."""

    id = "tracking-harness"

    async def start_session(self, prepared, env, model, plan):
        session = await super().start_session(prepared, env, model, plan)
        LIVE_HARNESS_SESSIONS.add(id(session))
        return session

    async def close_session(self, session):
        LIVE_HARNESS_SESSIONS.discard(id(session))
        await super().close_session(session)


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` right after the ``n``-th step of ``task``: the task
    is then suspended at a checkpoint, exactly as if another task cancelled it."""

    def __init__(self, n):
        self.n = n
        self.steps = 0
        self.task = None
        self.scope = None

    def after_task_step(self, task):
        if task is self.task:
            self.steps += 1
            if self.steps == self.n:
                self.scope.cancel()


SCENARIOS = {
    "reuse-with-policies": dict(
        k=2,
        bench={
            "plan": {
                "run_network_policy": {"mode": "none"},
                "evaluation_network_policy": {"mode": "allowlist", "allow": ["judge.example"]},
            }
        },
    ),
    "fresh-with-retry": dict(
        bench={"plan": {"evaluation_environment_mode": "fresh"}, "script": {"*": {"evaluate": ["fatal"]}}},
        max_retries=1,
        retry_min_delay_seconds=1,
        retry_max_delay_seconds=1,
    ),
    "harness-free-none": dict(free=True, bench={"plan": {"evaluation_environment_mode": "none"}}),
}


async def _attempt_under(instrument, kwargs):
    reset_logs()
    LIVE_HARNESS_SESSIONS.clear()
    request = make_request(harness_id="tracking-harness", **kwargs)
    ctx, reporter, grants = make_context(request, grace=3)
    task = (await ctx.benchmark.load_tasks(request))[0]
    instrument.task = trio.lowlevel.current_task()
    record = None
    with trio.CancelScope() as scope:
        instrument.scope = scope
        trio.lowlevel.add_instrument(instrument)
        try:
            record = await run_task(ctx, task, list(range(request.execution.attempts.k)))
        finally:
            trio.lowlevel.remove_instrument(instrument)
    return record, scope, reporter, grants


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_cancel_at_every_checkpoint_releases_everything(autojump_clock, scenario):
    kwargs = SCENARIOS[scenario]
    # First count the steps of an uncancelled run.
    counter = _CancelAtStep(math.inf)
    record, *_ = await _attempt_under(counter, kwargs)
    assert record is not None
    total = counter.steps
    assert total >= 8
    for n in range(1, total + 1):
        record, scope, reporter, grants = await _attempt_under(_CancelAtStep(n), kwargs)
        log = call_log("t")
        assert scope.cancelled_caught or record is not None, n
        if scope.cancelled_caught:
            assert record is None
            assert not reporter.discarded or reporter.discarded[-1] is not None
        assert not grants.held, n
        assert set(reporter.opened) <= set(reporter.closed), n
        assert log.live_sessions() == set(), n
        assert not LIVE_HARNESS_SESSIONS, n
        assert all(count == 1 for count in log.close_calls().values()), n
