"""One try of an attempt (SPEC section 5): the first run or one runtime retry.

A *full* try opens the task Environment, prepares the task, runs it
(through a harness session or the harness-free benchmark), collects
artifacts and evaluates according to ``evaluation_environment_mode``. An
*evaluation* try repeats only the evaluation stage with the prepared task
and run result of an earlier try: ``none`` re-runs ``evaluate`` without an
Environment, ``fresh`` reopens only the evaluation Environment.

Every exception a component raises becomes an Issue (see ``_issues``); only
``Cancelled``, ``KeyboardInterrupt`` and ``SystemExit`` propagate. Cleanup
runs innermost first (harness session, evaluation Environment, task
Environment) in ``finally`` paths, shielded until the grace deadline.

After a failure the try stops as early as is useful: after a FATAL (the
attempt cannot measure the agent) or a failure that will be retried, it
skips the remaining stages; an ERROR that will not be retried lets the try
go on to collect and evaluate, because the agent's output may still score.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import attrs

from .._gateway._bounds import attempt_gateway
from .._logging import debug_enabled, get_logger
from .._models._budget import metering
from ..runtime._components import BaseEnvironment, HarnessFreeBenchmark
from ..runtime._errors import ComponentError, IssueError
from ..runtime._results import Evaluation, Issue, Phase, RunBudget, RunResult
from ..runtime._values import ExecutionPlan, PreparedTask, TaskSpec
from ._context import RequestContext
from ._issues import classify
from ._phase_deadline import deadline_scope
from ._session import GuardedSession, TrackedSession, run_cleanup
from ._try_outcome import TryOutcome, retryable_issues
from ._try_steps import Stop, TrySteps


def build_config(environment: BaseEnvironment, plan: ExecutionPlan) -> Any:
    """The provider's open config for ``plan``, refusing first what the plan
    needs and the provider lacks (SPEC 4: never run it elsewhere silently)."""
    missing = environment.missing_features(plan)
    if "images" in missing:
        raise IssueError(
            "fatal",
            "image_required",
            f"task {plan.task_id!r} needs its image and provider {environment.id!r} cannot build or pull one "
            "(use a provider with images, such as docker)",
        )
    if missing:
        raise IssueError(
            "fatal",
            "environment_unsupported",
            f"task {plan.task_id!r} needs {', '.join(sorted(missing))}, which provider {environment.id!r} lacks",
        )
    return environment.build_config(plan)


__all__ = ["TryOutcome", "run_evaluation_try", "run_full_try", "retryable_issues"]

log = get_logger("agentcompass.attempt")


class _Try(TrySteps):
    """The stages of one try, each step taken as :class:`TrySteps` takes it."""

    # -- the task Environment stage ------------------------------------------

    async def full(self) -> TryOutcome:
        ctx, plan, issues = self.ctx, self.plan, self.out.task_issues
        try:
            config = build_config(ctx.environment, plan)
        except Exception as exc:
            issues.append(classify(exc, "environment", "setup", self.out.diagnostics))
            return self.out
        await self._in_sandbox("setup", issues, partial(self._task_stage, config))
        if self.out.evaluated or self._should_stop(issues) or not self.collected:
            return self.out
        if plan.evaluation_environment_mode == "none":
            await self._evaluate_without_env()
        elif plan.evaluation_environment_mode == "fresh":
            await self._evaluate_fresh(config)
        return self.out

    async def _in_sandbox(self, phase: Phase, issues: list[Issue], body: Any) -> None:
        """Hold a capacity permit and an open-rate token and run
        ``body(session)`` with a new :class:`TrackedSession` (``body`` opens
        it); close the session and release the permit on every way out. A
        ``Stop`` ends ``body`` quietly (its issue is recorded)."""
        ctx = self.ctx
        grants, provider, holder = ctx.grants, ctx.provider, object()
        await grants.acquire_capacity(provider, holder)
        try:
            await grants.open_token(provider)
            await self._write_plan(phase, issues)
            session = TrackedSession(
                ctx, phase=phase, grace=self.grace, issues=issues, diagnostics=self.out.diagnostics
            )
            try:
                await body(session)
            except Stop:
                pass
            finally:
                closing, was_open = self.now(), session.raw is not None
                await session.close()
                if was_open and debug_enabled():
                    self._trace("close", closing, session=session.session_id)
        finally:
            grants.release_capacity(provider, holder)

    async def _write_plan(self, phase: Phase, issues: list[Issue]) -> None:
        """Make the plan durable in the attempt's directory before its
        environment opens (SPEC 5 step 1; again on a retry, the same plan).
        Written once the permit is held, so tasks reach the capacity queue in
        their dispatch order; a plan that cannot be written opens nothing."""
        try:
            await self.ctx.reporter.attempt_plan(self.task.task_id, self.plan.attempt, self.plan)
        except Exception as exc:
            issues.append(classify(exc, "prepare_task", phase, self.out.diagnostics))
            raise Stop from None

    async def _task_stage(self, config: Any, session: TrackedSession) -> None:
        """Steps 2-6 in the task Environment (evaluation only in ``reuse`` mode)."""
        # The setup clock starts once the permit is held: waiting for
        # capacity is queueing, not a hung sandbox.
        timeout = self.ctx.request.execution.setup_timeout_seconds
        self.setup_deadline = self.now() + (math.inf if timeout is None else timeout)
        env = await self._open_and_prepare(session, config)
        await self._start_and_run(env)
        await self._collect(env)
        if self.plan.evaluation_environment_mode == "reuse" and not self._should_stop(self.out.task_issues):
            self._enter("evaluate")
            await self._evaluate_in(env, self.out.eval_issues)

    def _setup_timed_out(self) -> None:
        timeout = self.ctx.request.execution.setup_timeout_seconds
        self.out.task_issues.append(Issue("fatal", "setup", "setup_timeout", f"setup did not finish within {timeout}s"))
        raise Stop

    async def _open(self, session: TrackedSession, config: Any, issues: list[Issue]) -> GuardedSession:
        """Open ``session`` under the baseline policy (the caller closes it)."""
        try:
            return await session.open(config, self.plan.baseline_network_policy)
        except IssueError as exc:
            issues.append(classify(exc, "environment", session.phase, self.out.diagnostics))
            raise Stop from None
        finally:
            self.out.logs.update(session.logs)
            self.out.timings.update(session.timings)

    async def _open_and_prepare(self, session: TrackedSession, config: Any) -> GuardedSession:
        """Steps 2-3: open the task Environment under the baseline policy, prepare."""
        ctx, plan, issues = self.ctx, self.plan, self.out.task_issues
        start = self.now()
        with deadline_scope(self.setup_deadline) as scope:
            try:
                env = await self._open(session, config, issues)
            except Stop:
                self._mark("setup", start)  # an attempt that failed to open keeps its setup seconds
                raise
            opened = self.now()
            if debug_enabled():
                self._trace("open", start, session=session.session_id, handle=session.handle)
            prepared = await self._step(
                issues,
                "prepare_task",
                "setup",
                ctx.benchmark.prepare_task,
                self.task,
                env,
                ctx.request,
                plan.benchmark_plan,
            )
            self.out.prepared = self._check(prepared, PreparedTask, "prepare_task()", issues, "prepare_task", "setup")
            if debug_enabled():
                self._trace("prepare", opened)
        self._mark("setup", start)
        if scope.cancelled_caught:
            self._setup_timed_out()
        return env

    async def _start_and_run(self, env: GuardedSession) -> None:
        """Step 4: start the harness session and switch to the run policy if
        it differs (still bounded by the setup deadline), run, and close the
        harness session in a nested ``finally``."""
        ctx, plan, issues = self.ctx, self.plan, self.out.task_issues
        harness = ctx.harness
        started = False
        try:
            start = self.now()
            with deadline_scope(self.setup_deadline) as scope:
                if harness is not None:
                    self.harness_session = await self._step(
                        issues,
                        "start_session",
                        "setup",
                        harness.start_session,
                        self.out.prepared,
                        env,
                        ctx.request.model,
                        plan,
                    )
                    started = True
                if plan.run_network_policy != env.policy:
                    await self._step(issues, "environment", "setup", env.set_network_policy, plan.run_network_policy)
            self._mark("setup", start)
            if scope.cancelled_caught:
                self._setup_timed_out()
            await self._run(env)
        finally:
            if started:
                await self._close_harness(self.harness_session)

    async def _close_harness(self, harness_session: Any) -> None:
        harness = self.ctx.harness
        assert harness is not None
        await run_cleanup(
            self.grace,
            self.out.task_issues,
            self.out.diagnostics,
            "closing the harness session",
            harness.close_session,
            harness_session,
        )

    async def _run(self, env: GuardedSession) -> None:
        ctx, plan, issues = self.ctx, self.plan, self.out.task_issues
        assert self.out.prepared is not None
        timeout = plan.run_timeout_seconds
        limits = ctx.request.execution.limits
        budget = RunBudget(timeout, limits, None if timeout is None else time.time() + timeout)
        compensation = ctx.request.execution.run_timer_compensation_seconds
        hard_stop = math.inf if plan.run_timeout_seconds is None else plan.run_timeout_seconds + compensation
        self._enter("run")
        start = self.now()
        result: Any = None
        with deadline_scope(self.now() + hard_stop) as scope, metering(limits) as meter:
            try:
                if ctx.harness is not None:
                    where = "harness_run"
                    with attempt_gateway(ctx.tag, ctx.request.execution.gateway):
                        result = await ctx.harness.run_task(self.harness_session, self.out.prepared, budget)
                else:
                    where = "benchmark_run"
                    benchmark = ctx.benchmark
                    assert isinstance(benchmark, HarnessFreeBenchmark)
                    result = await benchmark.run_task(self.out.prepared, env, ctx.request.model, budget)
            except Stop:
                raise
            except Exception as exc:
                issues.append(classify(exc, where, "run", self.out.diagnostics))
        self._mark("run", start)
        if scope.cancelled_caught:
            issues.append(
                Issue("error", "run", "run_failed", f"run stopped at its budget plus {compensation}s compensation")
            )
        if result is not None:
            result = self._check(result, RunResult, "run_task()", issues, where, "run")
            self._add(issues, result.issues)
            if result.issues:
                result = attrs.evolve(result, issues=[])
        limited = meter.issue()
        if limited is not None and all(i.code != limited.code for i in issues):
            issues.append(limited)  # a harness that swallowed the refusal still ran into it
        self.out.run_result = result if result is not None else RunResult()
        if self._should_stop(issues):
            raise Stop

    async def _collect(self, env: GuardedSession) -> None:
        ctx, issues = self.ctx, self.out.task_issues
        assert self.out.prepared is not None and self.out.run_result is not None
        self._enter("collect")
        start = self.now()
        # SPEC 5 gives collection no timeout of its own; it is sandbox I/O on
        # the way to the score, so the evaluation timeout bounds it too, and a
        # collection that overruns it is a FATAL collect failure.
        timeout = self.plan.evaluation_timeout_seconds
        with deadline_scope(self._after(timeout)) as scope:
            result = await self._step(
                issues,
                "collect_artifacts",
                "collect",
                ctx.benchmark.collect_artifacts,
                self.out.prepared,
                self.out.run_result,
                env,
            )
        self._mark("collect", start)
        if scope.cancelled_caught:
            issues.append(
                Issue("fatal", "collect", "collect_failed", f"collect_artifacts did not finish within {timeout}s")
            )
            raise Stop
        result = self._check(result, RunResult, "collect_artifacts()", issues, "collect_artifacts", "collect")
        self._add(issues, result.issues)
        self.out.run_result = attrs.evolve(result, issues=[]) if result.issues else result
        self.collected = True
        if self._should_stop(issues):
            raise Stop

    # -- the evaluation stage ------------------------------------------------

    async def _evaluate(self, env: GuardedSession | None, issues: list[Issue], deadline: float | None = None) -> None:
        """``Benchmark.evaluate`` bounded by the evaluation timeout."""
        ctx, plan = self.ctx, self.plan
        assert self.out.prepared is not None and self.out.run_result is not None
        timeout = plan.evaluation_timeout_seconds
        if deadline is None:
            deadline = self._evaluation_deadline()
        start = self.now()
        evaluation: Any = None
        raised = False
        with deadline_scope(deadline) as scope:
            try:
                evaluation = await ctx.benchmark.evaluate(self.out.prepared, self.out.run_result, env, ctx.request)
            except Exception as exc:
                raised = True
                issues.append(classify(exc, "evaluate", "evaluate", self.out.diagnostics))
        self._mark("evaluate", start)
        self.out.evaluated = True
        if scope.cancelled_caught:
            issues.append(
                Issue("error", "evaluate", "evaluation_timeout", f"evaluation did not finish within {timeout}s")
            )
            self.out.values = dict(ctx.benchmark.evaluation_timeout_values)
            return
        if raised:
            return
        if not isinstance(evaluation, Evaluation):
            violation = ComponentError(f"evaluate() returned {type(evaluation).__name__}, expected Evaluation")
            issues.append(classify(violation, "evaluate", "evaluate", self.out.diagnostics))
            return
        self.out.values = dict(evaluation.values)
        self._add(issues, evaluation.issues)

    def _evaluation_deadline(self) -> float:
        timeout = self.plan.evaluation_timeout_seconds
        return self.now() + (math.inf if timeout is None else timeout)

    async def _evaluate_in(self, env: GuardedSession, issues: list[Issue]) -> None:
        """Evaluate in an open Environment under the evaluation policy, then
        restore the baseline (shielded). Never evaluates under a broader
        policy than asked: a failed switch stops the stage. The evaluation
        timeout bounds the switch and ``evaluate`` together; a switch that
        overruns it is an Environment failure, not a scoring timeout."""
        plan = self.plan
        deadline = self._evaluation_deadline()
        try:
            if plan.evaluation_network_policy != env.policy:
                with deadline_scope(deadline) as scope:
                    try:
                        await env.set_network_policy(plan.evaluation_network_policy)
                    except Exception as exc:
                        issues.append(classify(exc, "environment", "evaluate", self.out.diagnostics))
                        raise Stop from None
                if scope.cancelled_caught:
                    message = "switching to the evaluation network policy did not finish within the evaluation timeout"
                    issues.append(Issue("fatal", "evaluate", "environment_failed", message))
                    raise Stop
            await self._evaluate(env, issues, deadline)
        finally:
            if env.policy != plan.baseline_network_policy:
                await run_cleanup(
                    self.grace,
                    issues,
                    self.out.diagnostics,
                    "restoring the baseline network policy",
                    env.set_network_policy,
                    plan.baseline_network_policy,
                )

    async def _evaluate_without_env(self) -> None:
        self._enter("evaluate")
        self.out.eval_issues = []
        await self._evaluate(None, self.out.eval_issues)

    async def _evaluate_fresh(self, config: Any) -> None:
        self._enter("evaluate")
        issues: list[Issue] = []
        self.out.eval_issues = issues
        await self._in_sandbox("evaluate", issues, partial(self._fresh_stage, config, issues))

    async def _fresh_stage(self, config: Any, issues: list[Issue], session: TrackedSession) -> None:
        timeout = self.ctx.request.execution.setup_timeout_seconds
        with deadline_scope(self._after(timeout)) as scope:
            env = await self._open(session, config, issues)
        if scope.cancelled_caught:
            issues.append(
                Issue("fatal", "evaluate", "setup_timeout", f"evaluation environment not open within {timeout}s")
            )
            raise Stop
        await self._evaluate_in(env, issues)


async def run_full_try(ctx: RequestContext, task: TaskSpec, plan: ExecutionPlan, *, retries_left: bool) -> TryOutcome:
    """A try that opens a new task Environment and runs every stage."""
    return await _Try(ctx, task, plan, retries_left).full()


async def run_evaluation_try(
    ctx: RequestContext, task: TaskSpec, plan: ExecutionPlan, previous: TryOutcome, *, retries_left: bool
) -> TryOutcome:
    """Repeat only the evaluation stage of ``previous`` (modes ``none`` and ``fresh``)."""
    attempt = _Try(ctx, task, plan, retries_left)
    attempt.out = TryOutcome(
        task_issues=list(previous.task_issues),
        prepared=previous.prepared,
        run_result=previous.run_result,
        timings=dict(previous.timings),
    )
    if plan.evaluation_environment_mode == "none":
        await attempt._evaluate_without_env()
    else:
        config = build_config(ctx.environment, plan)
        await attempt._evaluate_fresh(config)
    return attempt.out
