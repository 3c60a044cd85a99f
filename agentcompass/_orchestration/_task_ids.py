"""Task IDs, checked on everything a benchmark's ``load_tasks`` returns
before ``select_tasks`` picks from it (SPEC 7, preparation: load, validate
the IDs, then select): a duplicate is an error even when the selection
would have picked another task.

A task ID names the task in every file of the run (task keys are made from
it, see ``_store._keys``) and on the console, so it must be a non-empty
string of printable characters, at most :data:`MAX_TASK_ID` of them, and
unique within the request. Bad IDs are bad input: one line naming the
first bad ID, a :class:`ConfigError` (the CLI exits 2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..runtime._errors import ComponentError, ConfigError
from ..runtime._values import TaskSpec

__all__ = ["MAX_TASK_ID", "check_task_ids"]

#: The longest task ID accepted, in characters.
MAX_TASK_ID = 512
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def check_task_ids(tasks: Sequence[Any], where: str) -> None:
    """Raise :class:`ConfigError` at the first task whose ID is empty,
    unsafe or a duplicate (``where`` names the benchmark), and
    :class:`ComponentError` at anything that is not a ``TaskSpec``."""
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        if not isinstance(task, TaskSpec):
            raise ComponentError(f"{where}: load_tasks() must return TaskSpec values")
        task_id = task.task_id
        problem = None
        if not isinstance(task_id, str) or not task_id.strip():
            problem = "is empty"
        elif len(task_id) > MAX_TASK_ID:
            problem = f"is longer than {MAX_TASK_ID} characters"
        elif _UNSAFE.search(task_id):
            problem = "holds a control character"
        elif task_id in seen:
            problem = "is a duplicate"
        if problem is not None:
            shown = repr(task_id) if not isinstance(task_id, str) or len(task_id) <= 80 else repr(task_id[:77] + "...")
            raise ConfigError(f"{where}: task id {shown} (task {index} of load_tasks) {problem}")
        seen.add(task_id)
