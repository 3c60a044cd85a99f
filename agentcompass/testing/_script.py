"""Scripts: what a fake does on its n-th call of a phase for a task.

A script is ``{task_id or "*": {phase: [action, ...]}}``. The n-th call
(counting from 0) of ``phase`` for a task performs the n-th action of the
task's own entry for that phase if it has one, else of the ``"*"`` entry;
past the end of the list it performs ``"ok"``. Calls are counted per
(log, component, task, phase) across component instances, so a retry that
builds new instances continues where the previous try stopped. Calls made
outside a task (``load_tasks``) use the ``"*"`` entry.

Actions:

=====================  ====================================================
``ok``                 succeed
``fatal``              raise ``IssueError("fatal", "fake_<phase>_fatal")``
``error``              raise ``IssueError("error", "fake_<phase>_error")``
``fatal:<code>``       raise ``IssueError("fatal", code, "<code> happened")``
``error:<code>``       raise ``IssueError("error", code, "<code> happened")``
``warning``            succeed; a phase returning a ``RunResult`` or an
                       ``Evaluation`` adds ``Issue("warning", ...,
                       "fake_<phase>_warning")`` to it
``raise``              raise an unclassified ``RuntimeError("fake <phase> crashed")``
``hang``               ``await trio.sleep_forever()``
``sleep:<seconds>``    ``await trio.sleep(seconds)``, then succeed
``harness_timeout``    ``run`` only: return a result carrying
                       ``Issue("error", "run", "harness_timeout")``
=====================  ====================================================

Every action starts with a checkpoint, as any Trio async function should, so
a call made in an already-cancelled scope raises ``Cancelled`` before acting.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import trio

from agentcompass.runtime import IssueError

from ._calls import ComponentKind, call_log

__all__ = ["check_script", "perform", "step"]

_PLAIN = {"ok", "fatal", "error", "warning", "raise", "hang", "harness_timeout"}
_RUN_ONLY = {"harness_timeout"}


def check_action(action: Any, phase: str) -> None:
    """Raise ``ValueError`` (``TypeError`` for a non-string) naming the problem when ``action`` is not in the vocabulary."""
    if not isinstance(action, str):
        raise TypeError(f"action {action!r} is not a string")
    kind, sep, arg = action.partition(":")
    if not sep:
        if kind not in _PLAIN:
            known = ", ".join(sorted(_PLAIN | {"fatal:<code>", "error:<code>", "sleep:<seconds>"}))
            raise ValueError(f"unknown action {action!r} (known: {known})")
        if kind in _RUN_ONLY and phase != "run":
            raise ValueError(f"action {action!r} only applies to the 'run' phase, not {phase!r}")
        return
    if kind in ("fatal", "error"):
        if not arg:
            raise ValueError(f"action {action!r} needs a code after the colon")
        return
    if kind == "sleep":
        try:
            seconds = float(arg)
        except ValueError:
            raise ValueError(f"action {action!r}: {arg!r} is not a number of seconds") from None
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"action {action!r}: seconds must be finite and >= 0")
        return
    raise ValueError(f"unknown action {action!r}")


def check_script(script: Mapping[str, Mapping[str, list[str]]], phases: Collection[str]) -> None:
    """Validate a whole script against the phases a component scripts."""
    for task_id, entry in script.items():
        for phase, actions in entry.items():
            if phase not in phases:
                raise ValueError(
                    f"script[{task_id!r}]: unknown phase {phase!r} (phases: {', '.join(phases)})"
                )
            for i, action in enumerate(actions):
                try:
                    check_action(action, phase)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"script[{task_id!r}][{phase!r}][{i}]: {exc}") from None


def script_validator(phases: Collection[str]) -> Any:
    """An attrs validator for a ``script`` config field."""

    def validate(_instance: Any, _attribute: Any, value: Mapping[str, Mapping[str, list[str]]]) -> None:
        check_script(value, phases)

    return validate


def pick(script: Mapping[str, Mapping[str, list[str]]], task_id: str | None, phase: str, index: int) -> str:
    entry = script.get(task_id) if task_id is not None else None
    actions = entry.get(phase) if entry is not None else None
    if actions is None:
        actions = script.get("*", {}).get(phase, [])
    return actions[index] if index < len(actions) else "ok"


async def perform(action: str, phase: str) -> str:
    """Act out ``action``: raise, hang or sleep as it says. Returns what the
    caller must still do: ``"ok"``, ``"warning"`` or ``"harness_timeout"``."""
    await trio.lowlevel.checkpoint()
    kind, _, arg = action.partition(":")
    if kind in ("fatal", "error"):
        if arg:
            raise IssueError(kind, arg, f"{arg} happened")  # type: ignore[arg-type]
        raise IssueError(kind, f"fake_{phase}_{kind}", f"fake {phase} failed ({kind})")  # type: ignore[arg-type]
    if kind == "raise":
        raise RuntimeError(f"fake {phase} crashed")
    if kind == "hang":
        await trio.sleep_forever()
    if kind == "sleep":
        await trio.sleep(float(arg))
        return "ok"
    return kind


async def step(
    log_name: str,
    script: Mapping[str, Mapping[str, list[str]]],
    component: ComponentKind,
    phase: str,
    task_id: str | None,
    session: int | None = None,
    detail: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """Log one call, then perform its scripted action.

    The call is logged before acting so that calls which fail, hang or are
    cancelled still show in the log. Returns the outcome of :func:`perform`
    and the call's index (0 for the first call of this phase for this task).
    """
    log = call_log(log_name)
    index = log.next_index(component, task_id, phase)
    action = pick(script, task_id, phase, index)
    log.record(component, phase, task_id, session, {**(detail or {}), "action": action})
    return await perform(action, phase), index
