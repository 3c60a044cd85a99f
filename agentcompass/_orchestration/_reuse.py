"""Reuse of an earlier run of the same request (SPEC section 8, ``--reuse``).

For each selected task, the earlier run's countable record or attempt
checkpoints decide what runs again:

* a record with no FATAL and no ERROR matching the current retry patterns
  is copied unchanged;
* with ``max_retries: 0``, failed records are copied unchanged too;
* with ``max_retries > 0``, each retryable attempt runs again as one retry
  of the current budget (evaluation-only in ``none`` / ``fresh`` mode when
  only its evaluation failed); its other attempts are kept;
* checkpoints of an interrupted task keep their attempts; only the missing
  attempts run;
* attempts missing from a record (``k`` grew, or a FATAL stopped the task
  early) run.

Only a run of the same experiment is reused (:func:`experiment_difference`:
benchmark, harness, model, environment id and attempts must match); unless
``reuse_anyway``, another is refused before anything runs
(:func:`refuse_other_experiments`, a :class:`ConfigError` naming the field
that differs: the CLI exits 2, no run directory is made). Before anything runs, every Environment session the earlier run opened and
never closed is reaped, and every provider it used is swept by its tag
(``BaseEnvironment.sweep``), holding the earlier run's lock: a run that is
still alive is refused. Tasks of the source that are no longer selected are
ignored and counted in a note.

Also before anything runs, the new run gets a copy of everything it takes
from the source: the reused records and, as checkpoints, the earlier
attempts of the tasks that run again. So a reuse run that is killed (or
cancelled) holds what it reused, and a reuse of it loses nothing. A record
reused unchanged is not serialized again: its file is hard-linked from the
source (no run ever changes a file in place, so neither run can see the
other's later writes) or, where it cannot be, its bytes are written (see
``_copy_into``). The default source is the latest run that got as far as
queuing its tasks (``"prepared": true`` in ``run_info.json``, written
before any task can start): a run killed while it prepared ran nothing and
may hold only part of its copies, so it is skipped (with a note) for the
run before it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import _registry
from .._gateway._gateway import remove_gateway_dirs
from .._logging import get_logger
from .._observations import is_success
from .._redact import redact_json_text
from .._report import display_path
from .._store import Disk, LoadedRun, latest_run, load_run
from .._store._layout import RunLayout
from .._store._run_store import RUN_ID_PATTERN, run_dir_lock
from ..runtime._components import BaseEnvironment
from ..runtime._convert import unstructure
from ..runtime._errors import ConfigError
from ..runtime._results import AttemptRecord, TaskRecord
from ..runtime._values import RunRequest, TaskSpec

__all__ = [
    "PendingTask",
    "ReusePlan",
    "experiment_difference",
    "plan_reuse",
    "reap_sessions",
    "refuse_other_experiments",
    "reuse_source",
    "sweep_run",
]


@attrs.frozen
class PendingTask:
    """A task waiting for a worker. Kept small: no coroutine, no component."""

    task: TaskSpec
    attempts: tuple[int, ...] | None = None  # None: all k attempts
    done: dict[int, AttemptRecord] | None = None
    resume: dict[int, AttemptRecord] | None = None


@attrs.define
class ReusePlan:
    pending: list[PendingTask]
    reused: list[TaskRecord] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    source: Path | None = None


log = get_logger(__name__)

#: What makes two runs the same experiment (SPEC section 8): request fields,
#: then the keys compared inside them (None: the whole value).
EXPERIMENT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("benchmark", ("id", "config")),
    ("harness", ("id", "config")),
    ("model", ("name", "api", "base_url", "params")),
    ("environment", ("id",)),
    ("execution", ("attempts",)),
)


def _comparable(value: Any) -> Any:
    """``value`` as the source run's ``run_info.json`` holds it: JSON, masked."""
    text = json.dumps(unstructure(value), sort_keys=True, default=str)
    return json.loads(redact_json_text(text))


def experiment_difference(old_request: dict[str, Any], request: RunRequest) -> str | None:
    """The first field in which the source run's request (``run_info.json``)
    differs from ``request`` as an experiment, e.g. ``model.name: 'a' != 'b'``;
    None when they are the same experiment. A source without a recorded
    request is taken as the same (nothing to compare)."""
    if not old_request:
        return None
    current = _comparable(request)
    for field, keys in EXPERIMENT_FIELDS:
        old, new = _as_dict(old_request.get(field)), _as_dict(current.get(field))
        for key in keys:
            if old.get(key) != new.get(key):
                return f"{field}.{key}: {_short(old.get(key))} != {_short(new.get(key))}"
    return None


def refuse_other_experiments(requests: Sequence[RunRequest]) -> None:
    """Raise :class:`ConfigError` when a request's ``--reuse`` source is
    another experiment and ``reuse_anyway`` is not set (blocking: it reads
    each source's ``run_info.json``). Called before anything runs, so a
    mismatch creates no run directory; a source without a readable
    ``run_info.json`` is left to :func:`plan_reuse`."""
    for request in requests:
        if request.reuse is False or request.reuse_anyway:
            continue
        source = reuse_source(request)
        if source is None:
            continue
        try:
            info = json.loads(Path(RunLayout(source).run_info).read_bytes())
        except (OSError, ValueError):
            continue
        old = info.get("request") if isinstance(info, dict) else None
        difference = experiment_difference(old if isinstance(old, dict) else {}, request)
        if difference is not None:
            raise ConfigError(_other_experiment(request, source, difference))


def _other_experiment(request: RunRequest, source: Path, difference: str) -> str:
    return (
        f"request {request.name!r}: --reuse of {display_path(source)} refused: another experiment ({difference}); "
        "drop --reuse, or add --reuse-anyway to reuse it all the same"
    )


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # ``harness: none``
        return {"id": value, "config": {}}
    return value if isinstance(value, dict) else {}


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _retryable(record: AttemptRecord, patterns: list[re.Pattern[str]]) -> bool:
    for issue in record.issues:
        if issue.severity == "fatal":
            return True
        if issue.severity == "error" and any(p.search(issue.message) or p.search(issue.code) for p in patterns):
            return True
    return False


async def reap_sessions(
    open_sessions: list[tuple[str, str, dict[str, Any]]],
    configs: dict[str, dict[str, Any]] | None = None,
    *,
    reaped: Callable[[str, str, dict[str, Any]], Awaitable[None]] | None = None,
) -> list[str]:
    """Reap sessions left open by a killed run; returns notes on failures.

    ``configs`` are Environment configs by provider id: a provider that needs
    its settings (a server URL, a root directory) to find its sandboxes gets
    them. ``reaped(session_id, provider, handle)`` is awaited after each
    session reaped (``compass reap`` journals it closed)."""
    notes: list[str] = []
    for session_id, provider, handle in open_sessions:
        failed = f"could not reap {provider} session {session_id}"
        done = await _call_provider(provider, configs, partial(_reap, handle), failed, notes)
        if done and reaped is not None:
            await reaped(session_id, provider, handle)
    return notes


async def sweep_run(loaded: LoadedRun, configs: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Sweep, by the run's tag, every provider a dead run used; returns notes
    on failures. This finds sandboxes whose ``open`` the kill interrupted
    before their journal line. A run recorded before runs had tags is not swept."""
    tag = loaded.tag
    if tag is None:
        return []
    notes: list[str] = []
    try:  # the model gateways' directories on this host, like sessions
        await trio.to_thread.run_sync(remove_gateway_dirs, tag)
    except (OSError, ValueError) as exc:
        notes.append(f"could not remove the model gateways' directories of {tag}: {type(exc).__name__}: {exc}")
    for provider in loaded.used_providers():
        failed = f"could not sweep {provider} sandboxes tagged {tag}"
        await _call_provider(provider, configs, partial(_sweep, tag), failed, notes)
    return notes


async def _reap(handle: dict[str, Any], env: BaseEnvironment) -> None:
    await env.reap(handle)


async def _sweep(tag: str, env: BaseEnvironment) -> None:
    await env.sweep(tag)


async def _call_provider(
    provider: str,
    configs: dict[str, dict[str, Any]] | None,
    call: Callable[[BaseEnvironment], Awaitable[None]],
    failed: str,
    notes: list[str],
) -> bool:
    """Build ``provider`` with its config and ``call`` it; a failure is a note
    (``failed: Error: message``) and never stops the caller's loop. True when it worked."""
    try:
        env = _registry.build("environment", provider, (configs or {}).get(provider, {}))
        await call(env)
    except Exception as exc:  # noqa: BLE001 - one failed provider must not stop the others
        notes.append(f"{failed}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return False
    return True


async def plan_reuse(
    request: RunRequest, primary: str, store: Any, tasks: list[TaskSpec], disk: Disk | None = None
) -> ReusePlan:
    """What of an earlier run ``request`` takes over (``primary``: the
    benchmark's primary metric), copied into ``store``'s run before anything
    runs; the rest is pending. The source is read through ``disk``."""
    if request.reuse is False:
        return ReusePlan([PendingTask(task) for task in tasks])
    skipped: list[Path] = []
    reads = disk if disk is not None else Disk()
    if isinstance(request.reuse, Path):
        source: Path | None = request.reuse
    else:
        source, skipped = await reads.run(_latest_prepared_run, request.output_root, request.name, store.run_dir)
    notes = [f"reuse: skipped {path}: it was stopped before it queued its tasks" for path in skipped]
    if source is None or not await reads.run(os.path.isdir, source):
        notes.append(f"reuse: no earlier run of {request.name!r} found; running everything")
        return ReusePlan([PendingTask(task) for task in tasks], notes=notes)
    # Held while the source's sandboxes are reaped: a run that is still alive
    # is refused (RunLockedError fails this request) and nothing is touched.
    with run_dir_lock(source):
        loaded = await reads.run(partial(load_run, source, keep_files=True))
        plan = ReusePlan([], source=source, notes=[*notes, f"reuse: from {source}", *loaded.notes])
        configs = _environment_configs(request, loaded.run_info)
        plan.notes.extend(await reap_sessions(loaded.open_sessions, configs))
        if loaded.open_sessions:
            plan.notes.append(f"reuse: reaped {len(loaded.open_sessions)} session(s) left open by the earlier run")
        plan.notes.extend(await sweep_run(loaded, configs))

    old_request = loaded.run_info.get("request", {}) if isinstance(loaded.run_info, dict) else {}
    difference = experiment_difference(old_request if isinstance(old_request, dict) else {}, request)
    if difference is not None:
        if not request.reuse_anyway:
            # Checked before anything ran (refuse_other_experiments): only a
            # run that became the latest since then gets here; this request fails.
            raise ConfigError(_other_experiment(request, source, difference))
        plan.notes.append(f"reuse: --reuse-anyway: reused {source} although it is another experiment ({difference})")

    execution = request.execution
    k = execution.attempts.k
    patterns = [re.compile(p) for p in (execution.retry_pattern_list or [])]
    selected = {task.task_id for task in tasks}
    ignored = sum(1 for task_id in loaded.details if task_id not in selected)
    if ignored:
        plan.notes.append(f"reuse: {ignored} task(s) of {source} are not selected now and were ignored")
    for where in loaded.unreadable:
        log.warning("reuse_unreadable_file", file=str(Path(source) / where))
    undetermined = [reason for task_id, reason in loaded.undetermined.items() if task_id in selected]
    if undetermined:
        line = (
            f"reuse: {len(undetermined)} task(s) run again: the severity of their earlier record cannot be "
            f"determined (e.g. {undetermined[0]})"
        )
        plan.notes.append(line)
        log.warning("reuse_undetermined_records", request=request.name, note=line)
    store.carry(loaded.unknown)
    verbatim: dict[str, tuple[str, bytes]] = {}  # task id -> its record file in the source, content
    for task in tasks:
        record = loaded.details.get(task.task_id)
        previous = {r.attempt: r for r in record.attempts} if record is not None else {}
        previous.update(loaded.checkpoints.get(task.task_id, {}))
        previous = {i: r for i, r in previous.items() if i < k}
        if not previous:
            plan.pending.append(PendingTask(task))
            continue
        done: dict[int, AttemptRecord] = {}
        resume: dict[int, AttemptRecord] = {}
        for index, attempt in previous.items():
            if execution.max_retries > 0 and _retryable(attempt, patterns):
                resume[index] = attempt
            else:
                done[index] = attempt
        missing = [i for i in range(k) if i not in previous]
        if record is not None and not resume and (not missing or _finished(record, execution.attempts.strategy, primary)):
            if len(done) == len(record.attempts):
                # Unchanged: its file is copied as it is (see _copy_into).
                plan.reused.append(record)
                verbatim[task.task_id] = loaded.files[task.task_id]
            else:
                plan.reused.append(attrs.evolve(record, attempts=[done[i] for i in sorted(done)]))
            continue
        plan.pending.append(PendingTask(task, tuple(sorted(missing + list(resume))), done, resume))
    await _copy_into(store, plan, verbatim)
    return plan


async def _copy_into(store: Any, plan: ReusePlan, verbatim: dict[str, tuple[str, bytes]]) -> None:
    """Copy what the new run takes from its source into it, before anything
    runs: the reused records, and the earlier attempts of the tasks that run
    again as checkpoints (the ones to retry too: should this run be
    interrupted before it retried them, a reuse of it retries them then).

    A record reused unchanged (``verbatim``: task id -> its file in the
    source and that file's content) is not serialized again: its file is
    hard-linked into the new run (see :meth:`RunStore.link_tasks`), or, where that
    cannot be done, its content is written. All writes are asked for at once,
    so that they share commits; if any failed, the first failure is raised
    once the others finished."""
    failures: list[Exception] = []

    async def save(write: Any, *args: Any) -> None:
        try:
            await write(*args)
        except Exception as exc:  # noqa: BLE001 - reported once, below
            failures.append(exc)

    links: list[tuple[TaskRecord, str, bytes]] = []
    async with trio.open_nursery() as nursery:
        for record in plan.reused:
            file = verbatim.get(record.task_id)
            if file is None:
                nursery.start_soon(save, store.save_task, record)
                continue
            source, data = file
            # The store masks everything it writes: the current secrets may
            # not be the ones the source run masked.
            masked = redact_json_text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
            if masked == data:
                links.append((record, source, data))
            else:
                nursery.start_soon(save, store.save_task, record, masked)
        for pending in plan.pending:
            for attempt in {**(pending.done or {}), **(pending.resume or {})}.values():
                nursery.start_soon(save, store.save_checkpoint, pending.task.task_id, attempt)
        if links:
            nursery.start_soon(save, store.link_tasks, links)
    if failures:
        raise failures[0]


def reuse_source(request: RunRequest) -> Path | None:
    """The run ``request`` would reuse, before its own run exists (blocking):
    for refusing a live source before anything is touched."""
    if request.reuse is False:
        return None
    if isinstance(request.reuse, Path):
        return request.reuse
    return _latest_prepared_run(request.output_root, request.name, None)[0]


def _latest_prepared_run(output_root: Path, name: str, own: Path | None) -> tuple[Path | None, list[Path]]:
    """The latest run of request ``name`` (not ``own``) that queued its tasks,
    and the later runs skipped because they did not (blocking: call it in a
    thread). Runs are ordered, and eligible, as for :func:`latest_run`."""
    latest = latest_run(output_root, name, own)
    if latest is None:
        return None, []
    own = Path(own).resolve() if own is not None else None
    names = sorted(
        (e.name for e in latest.parent.iterdir() if e.is_dir() and RUN_ID_PATTERN.fullmatch(e.name)),
        reverse=True,
    )
    skipped: list[Path] = []
    for run_id in names:
        candidate = latest.parent / run_id
        if run_id > latest.name or candidate.resolve() == own:
            continue
        if _was_prepared(candidate):
            return candidate, skipped
        skipped.append(candidate)
    return None, skipped


def _was_prepared(run_dir: Path) -> bool:
    """Whether the run got as far as queuing its tasks. A run written before
    runs recorded this (no ``prepared`` key) counts if it finished."""
    try:
        info = json.loads(Path(RunLayout(run_dir).run_info).read_bytes())
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict):
        return False
    if "prepared" in info:
        return info["prepared"] is True
    return info.get("status") not in (None, "running")


def _environment_configs(request: RunRequest, run_info: Any) -> dict[str, dict[str, Any]]:
    """Environment configs by provider id for reaping the source's sessions:
    the source's own (from its ``run_info.json``), and the current request's
    for its provider (it holds the live secrets, not their redacted form)."""
    configs: dict[str, dict[str, Any]] = {}
    raw = (run_info.get("request") or {}).get("environment") if isinstance(run_info, dict) else None
    if isinstance(raw, dict) and isinstance(raw.get("id"), str) and isinstance(raw.get("config"), dict):
        configs[raw["id"]] = raw["config"]
    configs[request.environment.id] = dict(request.environment.config)
    return configs


def _finished(record: TaskRecord, strategy: str, primary: str) -> bool:
    """True when the earlier record already settled the task (a FATAL stop,
    or a ``pass`` success), so its missing attempts need not run."""
    if record.severity == "fatal":
        return True
    return strategy == "pass" and any(is_success(a.values.get(primary)) for a in record.attempts)
