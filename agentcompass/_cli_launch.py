"""``compass launch`` and ``compass run``: flags over the config, the engine under the CLI's signal handling, the resume command."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .runtime._values import Orchestration

# What a command needs is imported inside it: ``compass --help`` loads no engine.

_LATEST = "\0latest"  # --reuse given without a value
INTERRUPTED_EXIT = 130
#: The signals that start the cleanup path, and the exit code of a run they stopped (128 + signum).
_SIGNALS = {
    signal.SIGINT: INTERRUPTED_EXIT,
    **{getattr(signal, name): 128 + getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)},
}


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


@click.command()
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


@click.command()
@click.option("--benchmark", help="Benchmark id ('terminal' with --dataset or --path).")
@click.option("--benchmark-config", default="{}", metavar="JSON", help="Benchmark config as a JSON object.")
@click.option("-d", "--dataset", metavar="NAME@VERSION", help="Run this dataset of the registry (terminal).")
@click.option(
    "-p", "--path", metavar="PATH", help="Run the task directories here, or at git+URL@REF#SUBDIR (terminal)."
)
@click.option(
    "--registry", metavar="FILE|URL", help="Registry of --dataset (default $AGENTCOMPASS_REGISTRY or Harbor's)."
)
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

    flags = {k: options.pop(k) for k in ("reuse", "reuse_anyway", "timeout_seconds", "task_concurrency", "output_root")}
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
