"""``python -m bench [--only NAME ...] [--repeat N] [--inspect] [--smoke]``.

Runs every scenario of :mod:`bench._scenarios` in a fresh subprocess,
``--repeat`` times (the table shows medians), writes
``bench/results/latest.json`` and prints one table row per target as
*measured / target*. ``--inspect`` adds the Inspect AI side-by-side
(:mod:`bench._inspect`), installed into its own virtual environment.
``--smoke`` uses tiny sizes (a check that the suite runs, not a measurement).
The exit status is 0 even when a target is missed: this reports, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._child import ROOT, run_child
from ._report import render_table, targets

#: Full sizes, as the performance issue states them.
FULL: dict[str, dict[str, Any]] = {
    "overhead": {"fn": "overhead_bound", "tasks": 10_000, "concurrency": 500},
    "overhead_k3": {"fn": "overhead_bound", "tasks": 3_000, "concurrency": 500, "k": 3},
    "latency": {"fn": "latency_bound", "tasks": 2_000, "concurrency": 200, "latency": 0.05},
    "memory": {"fn": "memory", "tasks": 100_000, "concurrency": 10, "hold": 3.0},
    "shutdown": {"fn": "shutdown", "active": 500, "hold": 2.0, "grace": 5.0},
    "reuse": {"fn": "reuse", "tasks": 10_000, "concurrency": 500},
    "open_rate": {"fn": "open_rate", "opens": 200, "rate": 50.0},
    "remote_exec": {"fn": "remote_exec", "execs": 300},
    "remote_sessions": {"fn": "remote_sessions", "sessions": 1000, "servers": 3},
    "remote_stream": {"fn": "remote_stream", "mib": 64},
    "agent": {"fn": "agent_bound", "tasks": 500, "concurrency": 100, "latency": 0.1, "steps": 4},
    "gateway": {"fn": "gateway_overhead", "tasks": 100, "concurrency": 10, "latency": 0.05},
    "sandbox": {"fn": "sandbox_open_close", "sessions": 200, "concurrency": 8, "held": 100},
    "docker": {"fn": "docker_open_close", "sessions": 100, "concurrency": 8, "execs": 200, "cli_execs": 30},
    "images": {"fn": "images_side_by_side", "sessions": 100, "concurrency": 8, "execs": 200},
    "ray": {"fn": "ray_scale", "tasks": 600, "concurrency": 200, "latency": 0.1, "steps": 4, "overhead_tasks": 3_000},
}

#: Smoke sizes: every code path, a few seconds in all.
SMOKE: dict[str, dict[str, Any]] = {
    "overhead": {"fn": "overhead_bound", "tasks": 40, "concurrency": 8},
    "overhead_k3": {"fn": "overhead_bound", "tasks": 15, "concurrency": 8, "k": 3},
    "latency": {"fn": "latency_bound", "tasks": 20, "concurrency": 10, "latency": 0.01},
    "memory": {"fn": "memory", "tasks": 200, "concurrency": 2, "hold": 0.3},
    "shutdown": {"fn": "shutdown", "active": 10, "hold": 0.3, "grace": 1.0},
    "reuse": {"fn": "reuse", "tasks": 30, "concurrency": 8},
    "open_rate": {"fn": "open_rate", "opens": 6, "rate": 50.0},
    "remote_exec": {"fn": "remote_exec", "execs": 5},
    "remote_sessions": {"fn": "remote_sessions", "sessions": 6, "servers": 3},
    "remote_stream": {"fn": "remote_stream", "mib": 1},
    "agent": {"fn": "agent_bound", "tasks": 6, "concurrency": 3, "latency": 0.01, "steps": 2},
    "gateway": {"fn": "gateway_overhead", "tasks": 4, "concurrency": 2, "latency": 0.01},
    "sandbox": {"fn": "sandbox_open_close", "sessions": 4, "concurrency": 2, "held": 3},
    "docker": {"fn": "docker_open_close", "sessions": 4, "concurrency": 2, "execs": 5, "cli_execs": 2},
    "images": {"fn": "images_side_by_side", "sessions": 4, "concurrency": 2, "execs": 5},
    "ray": {"fn": "ray_scale", "tasks": 6, "concurrency": 3, "latency": 0.01, "steps": 2, "overhead_tasks": 20},
}


def run_scenario(name: str, params: dict[str, Any], root: Path) -> dict[str, Any]:
    kwargs = {k: v for k, v in params.items() if k != "fn"}
    fn = params["fn"]
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    if fn == "shutdown":
        # Spawns its own child: run it here, it times that child's exit.
        from . import _scenarios

        return _scenarios.shutdown(scratch, **kwargs)
    result, _ = run_child(fn, root=str(scratch), **kwargs)
    return result


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric field, the median over the repeats; other fields from the first."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["repeats"] = len(runs)
    return out


#: How long ext4 treats a freed inode as recently deleted (60 s, plus 300 s
#: while its inode table block is dirty): allocating inodes then skips them
#: one by one, and creating files is several times slower.
_RECENTLY_DELETED_SECONDS = 360


def _warn_if_disk_busy(output: Path) -> None:
    """Say so when the previous run of the suite (which deleted its run
    directories as it ended) finished only moments ago."""
    try:
        age = time.time() - output.stat().st_mtime
    except OSError:
        return
    if age < _RECENTLY_DELETED_SECONDS:
        print(
            f"[bench] the previous run ended {age:.0f} s ago and deleted its files; on ext4, file creation "
            f"stays slow for up to {_RECENTLY_DELETED_SECONDS} s after that, which lowers the store-bound "
            "figures (overhead-bound, reuse). Wait a few minutes for a quiet-disk measurement.",
            file=sys.stderr,
            flush=True,
        )


#: Mean microseconds per file creation above which the disk counts as slow
#: (a quiet disk here: 20-40 us; right after many deletions: 400-800 us).
_SLOW_CREATE_US = 150.0


def disk_probe(directory: Path, files: int = 1_000) -> float:
    """Mean wall microseconds to create one empty file in a new directory
    under ``directory``: the state of the disk the store-bound figures
    depend on (see ``_RECENTLY_DELETED_SECONDS``)."""
    probe = directory / "disk-probe"
    probe.mkdir()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    t0 = time.perf_counter()
    for i in range(files):
        os.close(os.open(probe / str(i), flags, 0o644))
    return (time.perf_counter() - t0) / files * 1e6


def _probe_loop(n: int) -> None:
    table: dict[int, str] = {}
    for i in range(n):
        table[i % 1000] = str(i)


def cpu_probe(repeats: int = 5, n: int = 50_000) -> float:
    """Median thread-CPU milliseconds of a fixed pure-Python loop (dict and
    str work, about 10 ms): how fast the host runs Python at that moment.
    Taken before every run. On a shared virtual machine this moves by up
    to about 2 x within a minute, whatever the other vCPU does, and every
    CPU-bound figure moves with it."""
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        _probe_loop(n)
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[1])
    parser.add_argument("--only", action="append", choices=sorted(FULL), help="run only this scenario (repeatable)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario; the table shows medians (3)")
    parser.add_argument("--inspect", action="store_true", help="also run the Inspect AI side-by-side")
    parser.add_argument(
        "--inspect-scale",
        type=float,
        default=1.0,
        help="Inspect AI workloads at this fraction of our sizes (1.0; samples/s is size-independent once warm)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check that the suite runs")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    args = parser.parse_args(argv)

    sizes = SMOKE if args.smoke else FULL
    names = args.only or list(sizes)
    _warn_if_disk_busy(args.output)
    results: dict[str, Any] = {}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="agentcompass-bench-") as tmp:
        create_us = disk_probe(Path(tmp))
        results["disk"] = {"file_create_us": create_us}
        if create_us > _SLOW_CREATE_US:
            print(
                f"[bench] creating a file takes {create_us:.0f} us here (a quiet disk: 20-40 us): the disk is "
                "still slow from recent deletions, which lowers the store-bound figures.",
                file=sys.stderr,
                flush=True,
            )
        probes: list[float] = []
        results["host"] = {"cpu_probe_ms": probes}
        for name in names:
            runs = []
            for i in range(args.repeat):
                print(f"[bench] {name} run {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                probe = cpu_probe()
                probes.append(probe)
                try:
                    runs.append({**run_scenario(name, sizes[name], Path(tmp)), "cpu_probe_ms": probe})
                except Exception as exc:  # noqa: BLE001 - report it, go on with the others
                    print(f"[bench] {name} failed: {exc}", file=sys.stderr, flush=True)
            results[name] = (
                {**_median_run(runs), "runs": runs} if runs else {"error": "every run failed"}
            )
    if args.inspect:
        from ._inspect import side_by_side

        results["inspect"] = side_by_side(results, smoke=args.smoke, scale=args.inspect_scale)

    rows = targets(results)
    report = {
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": started,
        "duration_s": time.time() - started,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0],
        },
        "sizes": sizes,
        "results": results,
        "targets": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(render_table(rows))
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
