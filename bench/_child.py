"""Run one scenario function in a fresh interpreter and read its result back.

``python -m bench._child NAME JSON_KWARGS`` calls ``bench._scenarios.NAME(**kwargs)``
and prints its result as the last stdout line (JSON). A fresh process per
scenario keeps ``ru_maxrss``, caches and Trio state from leaking across them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Repository root: the child must import ``bench`` and ``agentcompass`` from here.
ROOT = Path(__file__).resolve().parent.parent


def _spawn(name: str, kwargs: dict[str, Any], **streams: Any) -> subprocess.Popen[str]:
    """Start ``python -m bench._child name kwargs`` from the repository root
    (text streams as given; stdout is always a pipe)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "bench._child", name, json.dumps(kwargs)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        **streams,
    )


def _result(out: str) -> dict[str, Any] | None:
    """A child's result: the last stdout line that is a JSON object."""
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _tail(err: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a child's stderr, for an error message."""
    return "\n".join(err.strip().splitlines()[-lines:])


def run_child(name: str, timeout: float = 900, **kwargs: Any) -> tuple[dict[str, Any], float]:
    """Run scenario ``name`` in a subprocess; return its result and the wall
    clock time (``time.time()``) at which the process was seen to exit."""
    proc = _spawn(name, kwargs, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"scenario {name} did not finish within {timeout}s") from None
    exited = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {name} exited with {proc.returncode}:\n{_tail(err)}")
    result = _result(out)
    if result is None:
        raise RuntimeError(f"scenario {name} printed no result:\n{out[-2000:]}\n{err[-2000:]}")
    return result, exited


def run_children_together(name: str, kwargs_list: list[dict[str, Any]], timeout: float = 900) -> list[dict[str, Any]]:
    """Run scenario ``name`` once per item of ``kwargs_list``, each in its
    own subprocess, and start them together: each child prints ``ready``
    once it is warmed up and waits for a line on stdin (see
    :func:`bench._scenarios.latency_share`). Returns their results in order."""
    with contextlib.ExitStack() as stack:
        # Each child's stderr goes to a file: a pipe nobody reads while the
        # children wait for their start could fill up and block them.
        errs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in kwargs_list]
        procs = [
            _spawn(name, kwargs, stdin=subprocess.PIPE, stderr=err) for kwargs, err in zip(kwargs_list, errs, strict=True)
        ]

        def failed(index: int, what: str) -> RuntimeError:
            errs[index].seek(0)
            return RuntimeError(f"scenario {name} (process {index + 1} of {len(procs)}) {what}:\n{_tail(errs[index].read())}")

        try:
            for index, proc in enumerate(procs):
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    proc.wait(timeout)
                    raise failed(index, f"exited with {proc.returncode} before it was ready")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = []
            for index, proc in enumerate(procs):
                out, _ = proc.communicate(timeout=timeout)
                result = _result(out)
                if proc.returncode != 0 or result is None:
                    raise failed(index, f"exited with {proc.returncode}")
                results.append(result)
            return results
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def main() -> None:
    from . import _scenarios

    name, kwargs = sys.argv[1], json.loads(sys.argv[2])
    fn = getattr(_scenarios, name)
    result = fn(**kwargs)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
