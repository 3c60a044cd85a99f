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

import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import click

from . import __version__
from ._cli_launch import INTERRUPTED_EXIT, launch, run
from ._cli_launch import _apply_cli as _apply_cli  # noqa: F401 - imported from here by tests
from ._cli_launch import _dataset_flags as _dataset_flags  # noqa: F401 - imported from here by tests
from ._cli_runs import _reap_run as _reap_run  # noqa: F401 - imported from here by tests
from ._cli_runs import reap, show, view

# What a command needs is imported inside it: ``compass --help`` loads no engine.

__all__ = ["cli", "main"]


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


for _command in (launch, run, show, reap, view):
    cli.add_command(_command)


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
