"""The ``compass`` command line.

Every command reports an invalid config or usage (:class:`ConfigError`,
including :class:`ComponentError`) as one line ``error: <message>`` on
stderr and exits 2, with nothing run and no run directory created: configs
are loaded and preflighted before the engine is started. Exit codes of
``launch`` / ``run``: 0 succeeded, 1 a request failed / partial failure /
timed out, 2 invalid config or usage, 130 interrupted.

Only the CLI installs signal handling: the first SIGINT (Ctrl-C), SIGTERM
or SIGHUP cancels the run, whose cleanup then gets the orchestration's
grace window, and then prints each interrupted run directory and the exact
command (this one, with ``--reuse``) that resumes it; the exit code is 130,
143 or 129. A second signal exits at once with its own code.

When a run ends, each request gets a compact report that fits 80 columns
(see ``_report``); the full one is the run's ``summary.md``.

``--reuse`` takes an optional value, so put it after the config path:
``compass launch config.yaml --reuse`` (latest run) or ``--reuse RUN_DIR``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import __version__

if TYPE_CHECKING:
    from .runtime._values import Orchestration

# What a command needs is imported inside it: ``compass --help`` loads no engine.

__all__ = ["cli", "main"]

_LATEST = "\0latest"  # --reuse given without a value
INTERRUPTED_EXIT = 130
#: The signals that start the cleanup path, and the exit code of a run they stopped (128 + signum).
_SIGNALS = {
    signal.SIGINT: INTERRUPTED_EXIT,
    **{getattr(signal, name): 128 + getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)},
}


def _config_messages(exc: BaseException) -> list[str] | None:
    """One line per config error in ``exc``, or None if it holds anything else."""
    from .runtime._errors import ConfigError

    if isinstance(exc, ConfigError):
        return [" ".join(str(exc).split())]
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(ConfigError)
        if rest is None and matched is not None:
            return [m for e in matched.exceptions for m in _config_messages(e) or []]
    return None


#: Entry-point group through which plugins add command groups to ``compass``
#: (name: the command; value: ``module:attribute`` of a click command).
CLI_ENTRY_POINT_GROUP = "agentcompass.cli"


def _plugin_commands() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=CLI_ENTRY_POINT_GROUP)}


class _PluginCommandError(click.ClickException):
    """A broken plugin command: one line, exit 2, like a broken component plugin."""

    exit_code = 2


class _Group(click.Group):
    """The root group: built-in commands, then plugin commands, each
    imported only when the command line needs it (its name, or ``--help``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_plugin_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        ep = _plugin_commands().get(cmd_name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except Exception as exc:  # noqa: BLE001 - reported as one line naming the plugin
            raise _PluginCommandError(f"plugin command {cmd_name!r} ({ep.value}) failed to import: {exc}") from None
        if not isinstance(loaded, click.Command):
            raise _PluginCommandError(f"plugin command {cmd_name!r} ({ep.value}) is not a click command")
        return loaded

    def invoke(self, ctx: click.Context) -> Any:
        from ._redact import redact
        from .runtime._errors import ConfigError

        try:
            return super().invoke(ctx)
        except (ConfigError, BaseExceptionGroup) as exc:
            messages = _config_messages(exc)
            if messages is None:
                raise
            for message in messages:
                click.echo(f"error: {redact(message)}", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="compass", message="%(prog)s %(version)s")
@click.option(
    "--log-level",
    default=lambda: os.environ.get("COMPASS_LOG_LEVEL", "warning"),
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Console log level (run-directory JSON logs always get info and above).",
)
def cli(log_level: str) -> None:
    """Evaluate LLM agents on benchmarks."""
    from . import _gc
    from ._logging import configure_logging

    configure_logging(console=True, level=log_level)
    _gc.allow()  # the CLI owns its process (see agentcompass._gc)


# ---------------------------------------------------------------- list / validate


@cli.command("list")
@click.option("--plugin", "plugins", multiple=True, help="Also import this module or .py file.")
@click.option("--verbose", "-v", is_flag=True, help="Also show each component's config keys.")
def list_command(plugins: Sequence[str], verbose: bool) -> None:
    """List registered components (--verbose: their config keys)."""
    from . import _registry
    from ._describe import describe_lines

    _registry.load_plugins(list(plugins), Path.cwd())
    registrations = _registry.registered()
    rows = [("KIND", "ID", "ORIGIN")] + [(r.kind, r.id, r.origin) for r in registrations]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    click.echo(f"{rows[0][0]:<{widths[0]}}  {rows[0][1]:<{widths[1]}}  {rows[0][2]}")
    for reg in registrations:
        click.echo(f"{reg.kind:<{widths[0]}}  {reg.id:<{widths[1]}}  {reg.origin}")
        if verbose:
            for line in describe_lines(reg.kind, reg.id, reg.cls, reg.origin, indent="    "):
                click.echo(line)
    if verbose:
        click.echo("\nRequest and run settings: compass describe execution, compass describe orchestration")


@cli.command()
@click.argument("component_id")
@click.option("--plugin", "plugins", multiple=True, help="Also import this module or .py file.")
def describe(component_id: str, plugins: Sequence[str]) -> None:
    """Show a component's (or config block's) keys and meaning.

    ID is a registered component's id, or `execution` / `orchestration` for
    the keys of those config blocks."""
    from . import _registry
    from ._describe import BLOCKS, block_lines, describe_lines
    from .runtime._errors import ConfigError

    _registry.load_plugins(list(plugins), Path.cwd())
    found = [r for r in _registry.registered() if r.id == component_id]
    if component_id in BLOCKS:
        for line in block_lines(component_id):
            click.echo(line)
    elif not found:
        known = ", ".join(sorted({r.id for r in _registry.registered()}))
        raise ConfigError(f"no component with id {component_id!r} (registered: {known}; blocks: {', '.join(BLOCKS)})")
    for i, reg in enumerate(found):
        if i or component_id in BLOCKS:
            click.echo("")
        click.echo(f"{reg.kind} {reg.id!r} from {reg.origin}")
        for line in describe_lines(reg.kind, reg.id, reg.cls, reg.origin, indent="  "):
            click.echo(line)


@cli.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config value.")
def validate(config: Path, overrides: Sequence[str]) -> None:
    """Check CONFIG as launch would, without running anything.

    Loads it, checks every key and value, imports its plugins, builds every
    component and runs each benchmark's own check of its data.
    """
    from ._config import load_config
    from ._preflight import preflight

    orchestration = load_config(config, overrides)
    preflight(orchestration, config.parent)
    click.echo(f"ok: {len(orchestration.requests)} request(s)")


# ---------------------------------------------------------------- launch / run


def _run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--reuse",
            is_flag=False,
            flag_value=_LATEST,
            default=None,
            metavar="[RUN_DIR]",
            help="Reuse finished results: of the latest run of each request, or of RUN_DIR.",
        ),
        click.option(
            "--reuse-anyway",
            is_flag=True,
            default=False,
            help="With --reuse: reuse the source run even if it is another experiment (recorded in run_info.json).",
        ),
        click.option("--timeout-seconds", type=float, help="Overall deadline of the orchestration."),
        click.option("-n", "--task-concurrency", type=int, help="Number of tasks run at once."),
        click.option("--output-root", type=click.Path(path_type=Path), help="Where run directories go."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config value."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _apply_cli(
    orchestration: Orchestration,
    reuse: str | None,
    timeout_seconds: float | None,
    task_concurrency: int | None,
    output_root: Path | None,
    reuse_anyway: bool = False,
) -> Orchestration:
    """Command-line flags win over the config."""
    import attrs

    changes: dict[str, Any] = {}
    if reuse is not None:
        changes["reuse"] = True if reuse == _LATEST else Path(reuse)
    if reuse_anyway:
        changes["reuse_anyway"] = True
        changes.setdefault("reuse", True)
    if output_root is not None:
        changes["output_root"] = output_root
    if changes:
        requests = [attrs.evolve(r, **changes) for r in orchestration.requests]
        orchestration = attrs.evolve(orchestration, requests=requests)
    if timeout_seconds is not None:
        orchestration = attrs.evolve(orchestration, timeout_seconds=timeout_seconds)
    if task_concurrency is not None:
        orchestration = attrs.evolve(orchestration, task_concurrency=task_concurrency)
    return orchestration


@cli.command()
@click.argument("config", type=click.Path(path_type=Path))
@_run_options
@click.pass_context
def launch(ctx: click.Context, config: Path, overrides: Sequence[str], **flags: Any) -> None:
    """Run every request of CONFIG."""
    from ._config import load_config
    from ._preflight import preflight

    orchestration = _apply_cli(load_config(config, overrides), **flags)
    preflight(orchestration, config.parent)
    _refuse_live_reuse(orchestration)
    ctx.exit(_execute(orchestration, config.parent, _resume_args(ctx)))


@cli.command()
@click.option("--benchmark", help="Benchmark id ('terminal' with --dataset or --path).")
@click.option("--benchmark-config", default="{}", metavar="JSON", help="Benchmark config as a JSON object.")
@click.option("-d", "--dataset", metavar="NAME@VERSION", help="Run this dataset of the registry (terminal).")
@click.option("-p", "--path", metavar="PATH", help="Run the task directories here, or at git+URL@REF#SUBDIR (terminal).")
@click.option("--registry", metavar="FILE|URL", help="Registry of --dataset (default $AGENTCOMPASS_REGISTRY or Harbor's).")
@click.option("-e", "--environment", default="docker", show_default=True, help="Environment id.")
@click.option("--environment-config", default="{}", metavar="JSON", help="Environment config as a JSON object.")
@click.option("--harness", help="Harness id ('none' for a harness-free benchmark; default none, or from --agent).")
@click.option("--harness-config", default="{}", metavar="JSON", help="Harness config as a JSON object.")
@click.option("-a", "--agent", help="Agent: 'oracle', or an installed agent id (harness 'installed').")
@click.option("-m", "--model", help="Model name.")
@click.option("--base-url", help="Model endpoint (OpenAI-compatible).")
@click.option("--api-key-env", metavar="VAR", help="Environment variable holding the model API key.")
@click.option("--name", help="Request name (default: <benchmark>-<harness>).")
@click.option("-k", "--k", "--n-attempts", "k", type=int, help="Attempts per task.")
@click.option("--max-retries", type=int, help="Extra tries per attempt.")
@click.option("--task-id", "task_ids", multiple=True, help="Run only this task (repeatable).")
@click.option("--limit", type=int, help="Run at most this many tasks.")
@click.option("--plugin", "plugins", multiple=True, help="Import this module or .py file.")
@_run_options
@click.pass_context
def run(ctx: click.Context, overrides: Sequence[str], **options: Any) -> None:
    """Run one request described by flags."""
    from ._config import build_orchestration
    from ._preflight import preflight

    flags = {
        k: options.pop(k) for k in ("reuse", "reuse_anyway", "timeout_seconds", "task_concurrency", "output_root")
    }
    _dataset_flags(options)
    data = {"plugins": list(options.pop("plugins")), "requests": [_request_from_flags(**options)]}
    orchestration = _apply_cli(build_orchestration(data, overrides, base_dir=Path.cwd()), **flags)
    preflight(orchestration, Path.cwd())
    _refuse_live_reuse(orchestration)
    ctx.exit(_execute(orchestration, Path.cwd(), _resume_args(ctx)))


def _dataset_flags(options: dict[str, Any]) -> None:
    """``--dataset``, ``--path``, ``--registry`` and ``--agent`` as Harbor
    users write them: the ``terminal`` benchmark's config and the harness."""
    from .runtime._errors import ConfigError

    dataset, path, registry, agent = (options.pop(k) for k in ("dataset", "path", "registry", "agent"))
    if dataset and path:
        raise ConfigError("give --dataset or --path, not both")
    if dataset:
        from .datasets import split_spec

        split_spec(dataset)  # a name that is no path component, before it names the request
    if dataset or path:
        options["benchmark"] = options["benchmark"] or "terminal"
        config = _json_object(options["benchmark_config"], "--benchmark-config")
        config.update({"dataset": dataset} if dataset else {"path": path})
        if registry:
            config["registry"] = registry
        options["benchmark_config"] = json.dumps(config)
    elif registry:
        raise ConfigError("--registry needs --dataset")
    if options["benchmark"] is None:
        raise ConfigError("give --benchmark, --dataset or --path")
    if agent:
        if options["harness"] not in (None, "installed" if agent != "oracle" else "oracle"):
            raise ConfigError(f"--agent {agent} and --harness {options['harness']} disagree")
        if agent == "oracle":
            options["harness"] = "oracle"
        else:
            options["harness"] = "installed"
            config = _json_object(options["harness_config"], "--harness-config")
            options["harness_config"] = json.dumps({**config, "agent": agent})
    options["harness"] = options["harness"] or "none"
    if options["name"] is None and dataset:
        label = agent or options["harness"]
        options["name"] = dataset.replace("@", "-") + ("" if label == "none" else f"-{label}")


def _request_from_flags(
    benchmark: str,
    benchmark_config: str,
    environment: str,
    environment_config: str,
    harness: str,
    harness_config: str,
    model: str | None,
    base_url: str | None,
    api_key_env: str | None,
    name: str | None,
    k: int | None,
    max_retries: int | None,
    task_ids: Sequence[str],
    limit: int | None,
) -> dict[str, Any]:
    """The raw config mapping of the request ``compass run`` describes."""
    from .runtime._errors import ConfigError

    request: dict[str, Any] = {
        "name": name or (benchmark if harness == "none" else f"{benchmark}-{harness}"),
        "benchmark": {"id": benchmark, "config": _json_object(benchmark_config, "--benchmark-config")},
        "environment": {"id": environment, "config": _json_object(environment_config, "--environment-config")},
        "harness": {"id": harness, "config": _json_object(harness_config, "--harness-config")},
    }
    if harness == "none":
        request["harness"] = "none"
    if model is not None:
        request["model"] = {"name": model, "base_url": base_url}
        if api_key_env:
            request["model"]["api_key"] = f"${{{api_key_env}}}"
    elif base_url or api_key_env:
        raise ConfigError("--base-url and --api-key-env need --model")
    execution: dict[str, Any] = {}
    if k is not None:
        execution["attempts"] = {"k": k}
    if max_retries is not None:
        execution["max_retries"] = max_retries
    if execution:
        request["execution"] = execution
    if task_ids:
        request["task_ids"] = list(task_ids)
    if limit is not None:
        request["limit"] = limit
    return request


def _json_object(text: str, option: str) -> dict[str, Any]:
    from .runtime._errors import ConfigError

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option} is not valid JSON: {exc}") from None
    except RecursionError:  # json's own recursion, far deeper than the config allows
        from ._config import MAX_NESTING

        raise ConfigError(f"{option} is nested deeper than {MAX_NESTING} levels") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} must be a JSON object, got {text!r}")
    return value


def _refuse_live_reuse(orchestration: Orchestration) -> None:
    """``--reuse`` of a run that is still alive would reap its sandboxes:
    refuse it (exit 2) before anything is created, as ``compass reap`` does;
    so is ``--reuse`` of another experiment without ``--reuse-anyway``."""
    from ._orchestration._reuse import refuse_other_experiments, reuse_source
    from ._store._run_store import run_is_live
    from .runtime._errors import ConfigError

    for request in orchestration.requests:
        source = reuse_source(request)
        if source is not None and source.is_dir() and run_is_live(source):
            raise ConfigError(
                f"cannot reuse {source} for request {request.name!r}: its run is still alive "
                "(already open by another writer); wait for it to end or stop it first"
            )
    refuse_other_experiments(orchestration.requests)


def _resume_args(ctx: click.Context) -> list[str]:
    """This command line without its ``--reuse``: what resuming it repeats."""
    argv = (ctx.find_root().obj or {}).get("argv")
    args = list(argv if argv is not None else sys.argv[1:])
    out: list[str] = []
    skip_value = False
    for i, arg in enumerate(args):
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        if arg == "--reuse":
            skip_value = i + 1 < len(args)
            continue
        if arg.startswith("--reuse="):
            continue
        out.append(arg)
    return out


def _run_dirs(orchestration: Orchestration) -> set[Path]:
    """Every run directory of the orchestration's requests that exists now."""
    found: set[Path] = set()
    for request in orchestration.requests:
        request_dir = Path(request.output_root) / request.name
        if request_dir.is_dir():
            found.update(p for p in request_dir.iterdir() if p.is_dir())
    return found


def _execute(orchestration: Orchestration, config_dir: Path, resume_args: list[str]) -> int:
    """Run the engine under our SIGINT handling; print where results went."""
    import trio

    engine_launch = (click.get_current_context().find_root().obj or {}).get("engine")  # see main
    if engine_launch is None:
        from ._orchestration._launch import launch as engine_launch

    # show_progress: a live table on a TTY, plain lines on stderr otherwise.
    kwargs: dict[str, Any] = {"config_dir": config_dir, "show_progress": True}
    before = _run_dirs(orchestration)
    result, stopped_by = trio.run(_launch_main, engine_launch, orchestration, kwargs)
    if stopped_by is not None:
        from ._report import display_path

        _print_resume([display_path(p) for p in sorted(_run_dirs(orchestration) - before)], resume_args)
        return _SIGNALS[stopped_by]
    if result is not None:
        _print_result(result)
    return int(result.exit_code) if result is not None else 1


def _print_resume(run_dirs: list[Path], resume_args: list[str]) -> None:
    """Where the interrupted run is, and the exact command that resumes it."""
    for run_dir in run_dirs:
        click.echo(f"interrupted run: {run_dir}", err=True)
    if not run_dirs:
        return
    # One request: name its run; several: --reuse takes each request's latest run, these.
    reuse = ["--reuse", str(run_dirs[0])] if len(run_dirs) == 1 else ["--reuse"]
    click.echo(f"resume with: {shlex.join(['compass', *resume_args, *reuse])}", err=True)


async def _launch_main(
    engine_launch: Any, orchestration: Orchestration, kwargs: dict[str, Any]
) -> tuple[Any, int | None]:
    """``launch``, stopped (its ``stop`` event) by the first SIGINT, SIGTERM
    or SIGHUP; returns the result and the signal that stopped the run.

    The engine then runs its own cleanup, bounded by the grace; the watcher
    keeps running through it so a second signal (of any of the three) ends
    the process at once, with the exit code of that signal.
    """
    import signal

    import trio

    from ._store._run_store import write_journals_now

    stopped_by: int | None = None
    result = None
    stop = trio.Event()

    async def watch(signals: Any) -> None:
        nonlocal stopped_by
        async for signum in signals:
            if stopped_by is not None:
                # Leaving without unwinding: first put every queued session
                # journal line on disk, so what was opened stays reapable.
                write_journals_now()
                os._exit(_SIGNALS[signum])
            stopped_by = signum
            if signum == signal.SIGINT:
                message = "interrupted: cleaning up (Ctrl-C again to exit now)"
            else:
                message = f"interrupted by {signal.Signals(signum).name}: cleaning up (send it again to exit now)"
            print(message, file=sys.stderr, flush=True)
            stop.set()

    with trio.open_signal_receiver(*_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, signals)
            try:
                result = await engine_launch(orchestration, stop=stop, **kwargs)
            finally:
                nursery.cancel_scope.cancel()
    return result, stopped_by


def _print_result(result: Any) -> None:
    """A compact report per request (the full one is each run's summary.md)."""
    from ._report import render_request_report

    tty = sys.stdout.isatty()
    for request in result.requests:
        click.echo(render_request_report(request.name, request.status, request.run_dir, request.metrics, tty))
        click.echo("")
    click.echo(f"{result.status} (exit {result.exit_code})")


# ---------------------------------------------------------------- datasets


@cli.group()
def datasets() -> None:
    """List and fetch the datasets of a registry.

    The registry is a file or URL in Harbor's registry.json format (see docs/datasets.md)."""


@datasets.command("list")
@click.option("--registry", metavar="FILE|URL", help="Registry (default $AGENTCOMPASS_REGISTRY or Harbor's).")
def datasets_list(registry: str | None) -> None:
    """List the registry's datasets: NAME@VERSION, tasks, description."""
    from .datasets import cache_root, read_registry, registry_source

    source = registry_source(registry)
    entries = read_registry(source, cache_root())
    click.echo(f"registry: {source}")
    for entry in sorted(entries, key=lambda d: (d.name, d.version)):
        description = " ".join(entry.description.split())
        tasks = f"{len(entry.tasks)} task{'s' if len(entry.tasks) != 1 else ''}"
        click.echo(f"{entry.spec:<36} {tasks:>11}  {description[:80]}".rstrip())


@datasets.command("pull")
@click.argument("spec", metavar="NAME@VERSION")
@click.option("--registry", metavar="FILE|URL", help="Registry (default $AGENTCOMPASS_REGISTRY or Harbor's).")
def datasets_pull(spec: str, registry: str | None) -> None:
    """Fetch every task of a dataset at its pinned commit into the cache."""
    import trio

    from .datasets import pull_dataset

    pulled = trio.run(pull_dataset, spec, registry)
    commits = sorted(set(pulled.commits.values()))
    click.echo(f"{pulled.dataset.spec}: {len(pulled.directories)} task(s) at {len(commits)} commit(s)")
    for directory in pulled.directories:
        click.echo(f"  {directory.name}: {directory}")


# ---------------------------------------------------------------- show / reap


@cli.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--output-root", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
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


@cli.command()
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


@cli.command()
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0 picks a free one).")
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


def main(argv: Sequence[str] | None = None, *, engine: Callable[..., Awaitable[Any]] | None = None) -> None:
    """Console entry point (``compass``).

    ``engine`` is what ``launch`` and ``run`` call in place of
    :func:`agentcompass.launch`, with the same arguments, for a program that
    wraps the command line around another engine (a test's fake, or the
    engine on a test's disk: ``functools.partial(orchestrate, disk=...)``).
    """
    args = list(argv) if argv is not None else None
    try:
        code = cli.main(args=args, prog_name="compass", standalone_mode=False, obj={"argv": args, "engine": engine})
    except click.ClickException as exc:  # usage errors: exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        # Ctrl-C outside the run's own handler (while loading): still 130, not click's 1.
        print("interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
