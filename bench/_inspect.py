"""The Inspect AI side-by-side (``python -m bench --inspect``).

Inspect AI is installed into its own virtual environment,
``bench/.venv-inspect`` (gitignored), never the project's: ``python -m venv``
then ``pip install inspect-ai``. There :mod:`bench._inspect_worker` runs the
equivalent of the overhead-bound and latency-bound workloads (a custom model
that sleeps L and returns a fixed answer, the exact-match scorer, no
sandbox, ``max_samples`` = the concurrency, its default log on). The
ratios compare numbers measured in the same ``python -m bench`` run.

Where the package cannot be installed (no network, no wheel for this
Python) or the run fails, the side-by-side is skipped with a message saying
why; the rest of the report stands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._agent import inspect_agent
from ._child import ROOT

VENV = ROOT / "bench" / ".venv-inspect"
WORKER = ROOT / "bench" / "_inspect_worker.py"


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_inspect() -> tuple[Path | None, str]:
    """The Inspect venv's interpreter (installing it if needed), or None and why not."""
    python = _python()
    probe = [str(python), "-c", "import inspect_ai; print(inspect_ai.__version__)"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0:
            return python, done.stdout.strip()
    print(f"[bench] installing inspect-ai into {VENV} ...", file=sys.stderr, flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, text=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "inspect-ai"],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        done = subprocess.run(probe, capture_output=True, text=True, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        last = (detail.strip().splitlines() or [""])[-1]
        return None, f"inspect-ai could not be installed into {VENV}: {last}"
    return python, done.stdout.strip()


def _run_worker(python: Path, n: int, concurrency: int, latency: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="inspect-logs-") as logs:
        done = subprocess.run(
            [str(python), str(WORKER), str(n), str(concurrency), str(latency), logs],
            capture_output=True,
            text=True,
            timeout=3600,
            env={**os.environ, "INSPECT_LOG_LEVEL": "warning"},
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"inspect worker failed ({done.returncode}): {tail}")
    return json.loads(lines[-1])


def side_by_side(results: dict[str, Any], *, smoke: bool = False, scale: float = 1.0) -> dict[str, Any]:
    """Run Inspect AI's equivalents of the overhead- and latency-bound
    scenarios of ``results`` (same sizes, times ``scale``) and the ratios."""
    python, version = ensure_inspect()
    if python is None:
        print(f"[bench] SKIPPED the Inspect AI side-by-side: {version}", file=sys.stderr, flush=True)
        return {"skipped": version}
    out: dict[str, Any] = {"inspect_ai": version, "venv": str(VENV), "scale": scale}
    try:
        ours = results.get("overhead") or {}
        if "attempts_per_s" in ours:
            n = max(10, int(ours["tasks"] * scale))
            print(f"[bench] inspect overhead-bound ({n} samples) ...", file=sys.stderr, flush=True)
            theirs = _run_worker(python, n, int(ours["concurrency"]), 0.0)
            out["overhead"] = theirs
            out["ratio_overhead"] = ours["attempts_per_s"] / theirs["samples_per_s"]
        ours = results.get("latency") or {}
        if "wall_over_ideal" in ours:
            n = max(10, int(ours["tasks"] * scale))
            c = int(ours["concurrency"])
            print(f"[bench] inspect latency-bound ({n} samples) ...", file=sys.stderr, flush=True)
            theirs = _run_worker(python, n, c, float(ours["latency_s"]))
            ideal = -(-n // c) * float(ours["latency_s"])
            theirs["ideal_s"] = ideal
            theirs["wall_over_ideal"] = theirs["wall_s"] / ideal
            out["latency"] = theirs
            out["inspect_latency_wall_over_ideal"] = theirs["wall_over_ideal"]
            out["ratio_latency"] = theirs["wall_over_ideal"] / ours["wall_over_ideal"]
        ours = results.get("agent") or {}
        if "wall_over_ideal" in ours:
            print(f"[bench] inspect agent-bound ({ours['tasks']} samples) ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="inspect-agent-") as scratch:
                out["agent"] = inspect_agent(python, ours, Path(scratch), scale)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        print(f"[bench] SKIPPED the rest of the Inspect AI side-by-side: {exc}", file=sys.stderr, flush=True)
        out["skipped"] = str(exc)
    return out
