"""``compass show``, ``reap`` and ``view``: the commands over run directories that already exist."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

# What a command needs is imported inside it: ``compass --help`` loads no engine.


@click.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--output-root",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Where to find the latest run (at any depth) when RUN_DIR is not given.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (status, metrics, counts, paths).")
def show(run_dir: Path | None, output_root: Path, as_json: bool) -> None:
    """Show a run's metrics and tasks (default: the latest run).

    RUN_DIR may also be a request directory (OUTPUT_ROOT/NAME): its runs are
    listed; any other directory shows the latest run under it.
    """
    from ._report._show import render_overview, render_run_list, run_overview
    from ._store._layout import is_run_dir
    from .runtime._errors import ConfigError

    if run_dir is None:
        run_dir = _latest_run(output_root)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory not found: {run_dir}")
    if not is_run_dir(run_dir):
        runs = sorted(p for p in run_dir.iterdir() if is_run_dir(p))
        if runs and as_json:
            click.echo(json.dumps({"runs": [run_overview(p)[1] for p in runs]}, indent=2, default=str))
            return
        if runs:
            click.echo(render_run_list(run_dir))
            return
        run_dir = _latest_run(run_dir)
    loaded, view = run_overview(run_dir)
    click.echo(json.dumps(view, indent=2, default=str) if as_json else render_overview(loaded, view).rstrip())


def _latest_run(output_root: Path) -> Path:
    """The most recent run directory of any request under ``output_root``, at any depth."""
    from ._report._runs import latest_run
    from .runtime._errors import ConfigError

    found = latest_run(output_root)
    if found is None:
        raise ConfigError(f"no runs under {output_root} (give RUN_DIR or --output-root)")
    return found


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--plugin", "plugins", multiple=True, help="Import this module or .py file first.")
@click.pass_context
def reap(ctx: click.Context, run_dir: Path, plugins: Sequence[str]) -> None:
    """Destroy sandboxes a killed run left open.

    Reads RUN_DIR/sessions.jsonl and reaps every session opened and never closed.
    """
    import trio

    from . import _registry
    from .runtime._errors import ConfigError

    if not run_dir.is_dir():
        raise ConfigError(f"run directory not found: {run_dir}")
    _registry.load_plugins(list(plugins), Path.cwd())
    reaped, failed = trio.run(_reap_run, run_dir.resolve())
    click.echo(f"reaped {reaped} session(s)" + (f", {failed} failed" if failed else ""))
    ctx.exit(1 if failed else 0)


def _environment_configs(run_info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run's environment config (from ``run_info.json``), keyed by provider,
    so a provider that needs settings to find its sandboxes gets them."""
    from .runtime._convert import structure
    from .runtime._errors import ConfigError
    from .runtime._values import ComponentRef

    raw = (run_info.get("request") or {}).get("environment")
    if raw is None:
        return {}
    try:
        ref = structure(raw, ComponentRef)
    except ConfigError:
        return {}
    return {ref.id: ref.config}


async def _reap_run(run_dir: Path) -> tuple[int, int]:
    """Reap every session journalled as opened and never closed; journal each
    reaped one as closed through the run's store (which refuses a run that
    is still being written)."""
    from functools import partial

    import trio

    from ._orchestration._reuse import reap_sessions, sweep_run
    from ._redact import redact
    from ._store import load_run, open_run_store
    from .runtime._errors import ConfigError

    loaded = await trio.to_thread.run_sync(partial(load_run, run_dir, records=False))
    if not loaded.open_sessions and loaded.tag is None:
        return 0, 0
    configs = _environment_configs(loaded.run_info)
    reaped = failed = 0
    entered = False
    try:
        async with open_run_store(run_dir.parent.parent, run_dir.parent.name, run_dir.name) as store:
            entered = True

            async def journal_closed(session_id: str, provider: str, handle: dict[str, Any]) -> None:
                nonlocal reaped
                await store.journal_session("closed", session_id, provider, handle)
                reaped += 1

            notes = await reap_sessions(loaded.open_sessions, configs, reaped=journal_closed)
            # Sandboxes whose open the kill interrupted before their journal line.
            notes += await sweep_run(loaded, configs)
            for note in notes:
                failed += 1
                click.echo(f"warning: {redact(note)}", err=True)
    except RuntimeError as exc:
        if entered:
            raise
        raise ConfigError(f"cannot reap {run_dir}: {exc}") from None
    return reaped, failed


# ---------------------------------------------------------------- view


@click.command()
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Port on 127.0.0.1 (0 picks a free one).",
)
@click.option("--out", type=click.Path(path_type=Path), help="Write the pages as static files to DIR instead.")
def view(run_dirs: Sequence[Path], port: int, out: Path | None) -> None:
    """Browse runs in a web page (read-only).

    RUN_DIR is a run directory, or a directory searched for runs at any depth
    (default: runs), or an ATIF trajectory file (an attempt's
    agent/trajectory.json, or one from any other tool), shown on a page of
    its own. Serves on 127.0.0.1 until Ctrl-C, or writes the pages as static
    files with --out."""
    import signal

    import trio

    from ._report._runs import find_run_dirs
    from ._store._layout import is_run_dir
    from ._view import ROW_BUDGET_SECONDS, Site, find_runs, serve, write_site
    from .runtime._errors import ConfigError

    paths = list(run_dirs) or [Path("runs")]
    atif_files = [path.resolve() for path in paths if path.is_file()]
    paths = [path for path in paths if not path.is_file()]
    for path in paths:
        if not path.is_dir():
            raise ConfigError(f"run directory not found: {path}")
    # Runs at any depth (`make demo` writes to runs/demo/<request>/<run id>), latest first.
    runs = find_runs([run for path in paths for run in find_run_dirs(path)])
    if not runs and not atif_files:
        raise ConfigError(f"no run directory found under {', '.join(str(p) for p in paths)}")
    if out is not None:
        target = out.resolve()
        for run in runs:
            if target == run or run in target.parents:
                raise ConfigError(f"--out {out} is inside the run directory {run}; the viewer never writes there")
            if target in run.parents:
                raise ConfigError(f"--out {out} holds the run directory {run}; write the pages elsewhere")
        if is_run_dir(target):
            raise ConfigError(f"--out {out} is a run directory; the viewer never writes there")
        count = write_site(Site(runs, live=False, static=True, atif_files=atif_files), target)
        click.echo(f"wrote {count} file(s) for {len(runs)} run(s); open {target / 'index.html'}")
        return

    async def serve_until_interrupted() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                try:
                    site = Site(runs, live=True, row_budget=ROW_BUDGET_SECONDS, atif_files=atif_files)
                    url = await nursery.start(serve, site, port)
                except OSError as exc:
                    raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
                click.echo(f"serving {len(runs)} run(s) at {url} (Ctrl-C to stop)")
                for index, file in enumerate(atif_files):
                    click.echo(f"ATIF {file}: {url}atif/{index}.html")
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(serve_until_interrupted)
    click.echo("stopped", err=True)
