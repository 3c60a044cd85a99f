"""Helpers for the command-line tests in this directory: the real ``compass``
in a subprocess, and task directories written on the spot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _common import only_run_dir as only_run_dir
from _common import read_json as read_json
from _terminal_tasks import PASSING_TEST as PASSING_TEST
from _terminal_tasks import make_task as make_task

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]


def compass(cwd: Path, *args: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``compass ARGS`` in ``cwd`` (stdout is not a TTY)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.pop("COMPASS_LOG_LEVEL", None)
    for name in unset:
        full_env.pop(name, None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", *args],
        capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120, check=False,
    )


