"""structlog configuration: redacted console output plus JSON-lines files.

The processor chain is: merge context variables, add level and UTC
timestamp, format exceptions, **redact** (every string value goes through
:func:`agentcompass._redact.redact`), write one JSON line to every attached
file, then render for the console to stderr: one line a person reads
(:class:`HumanRenderer`, ``warning: qa: task q1 invalidated: FATAL
model_quota: ...``), its level in colour on a TTY, plain text otherwise.
The console has its own level (or is off); files get ``info`` and above.
Redaction runs before both renderers, so no secret reaches a file or a
terminal.

JSON files are attached and detached at run time with :func:`add_json_log`
and :func:`remove_json_log` (the engine attaches one per request run
directory). A file attached with ``request=NAME`` only receives events bound
to that request (``log.bind(request=NAME)`` or
``structlog.contextvars.bind_contextvars(request=NAME)``) and events bound to
no request; a file attached without it receives everything.

Only structlog's sync methods are used (its async ones run on asyncio).
Writes are small and line-buffered; they block the Trio thread briefly, as
console logging does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from ._redact import redact

__all__ = ["add_json_log", "configure_logging", "debug_enabled", "get_logger", "launch_logging", "remove_json_log"]

_lock = threading.Lock()
# Whether debug events are rendered anywhere: hot paths test it before building one.
_debug = False
# path -> (open file, request name filter or None)
_json_logs: dict[Path, tuple[IO[str], str | None]] = {}


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    # Anything else is rendered with str() by both renderers: redact that text.
    return redact(str(value))


def redact_processor(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: redact every value of the event."""
    return {key: _redact_value(value) for key, value in event_dict.items()}


def _write_json_logs(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if not _json_logs:
        return event_dict
    line = json.dumps(event_dict, default=str, ensure_ascii=False) + "\n"
    request = event_dict.get("request")
    with _lock:
        for handle, only in _json_logs.values():
            if only is None or request is None or request == only:
                try:
                    handle.write(line)
                except OSError:
                    # A full disk under one run's log must not fail the code
                    # that logs (often the very report of that disk's failure).
                    pass
    return event_dict


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at each write: an application (or a test
    runner) that swaps it later still gets the console lines."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR: Any = _CurrentStderr()


#: How the console words the runtime's own events (each key a field of the
#: event); an event without a template, or missing one of its fields, gets
#: the generic line (see :class:`HumanRenderer`).
_TEMPLATES = {
    "task_invalidated": "task {task} invalidated: FATAL {code}: {message}",
    "request_failed": "request failed: {error}",
    "provider_limits": "{note}",
}
#: Fields that say what happened, put after the event on the generic line.
_MESSAGE_KEYS = ("message", "error", "note", "reason", "difference")
#: Fields the console line does not repeat (the JSON file keeps them all).
_UNSHOWN = frozenset({"timestamp", "level", "event", "logger", "request", "exception", "stack"})
_LEVEL_STYLES = {"debug": "\x1b[2m", "info": "\x1b[36m", "warning": "\x1b[33m", "error": "\x1b[1;31m", "critical": "\x1b[1;31m"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _one_line(value: Any) -> str:
    return _CONTROL.sub(" ", value if isinstance(value, str) else json.dumps(value, default=str)).strip()


class HumanRenderer:
    """Render an event as one line for a person, not for a parser (the JSON
    files are for those): ``LEVEL: REQUEST: what happened``.

    An event with a template in ``_TEMPLATES`` reads as a sentence; any
    other is ``LEVEL: REQUEST: event: message (key=value, ...)``, the event
    name kept as it is (it is what to search ``log.jsonl`` for). Values are
    shown as they are, never quoted; a traceback follows on its own lines.
    ``colors`` styles the level (on a TTY)."""

    def __init__(self, colors: bool) -> None:
        self.colors = colors

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.get("level", "info"))
        head = f"{_LEVEL_STYLES.get(level, '')}{level}\x1b[0m:" if self.colors else f"{level}:"
        parts = [head]
        if event_dict.get("request") is not None:
            parts.append(f"{_one_line(event_dict['request'])}:")
        parts.append(self._text(event_dict))
        line = " ".join(parts)
        trace = event_dict.get("exception") or event_dict.get("stack")
        return f"{line}\n{str(trace).rstrip()}" if trace else line

    @staticmethod
    def _text(event_dict: MutableMapping[str, Any]) -> str:
        event = _one_line(event_dict.get("event", ""))
        fields = {k: v for k, v in event_dict.items() if k not in _UNSHOWN}
        template = _TEMPLATES.get(event)
        if template is not None:
            try:
                return template.format_map({k: _one_line(v) for k, v in fields.items() if v is not None})
            except KeyError:
                pass  # a field is missing: the generic line shows what there is
        said = [_one_line(fields.pop(k)) for k in _MESSAGE_KEYS if fields.get(k) is not None]
        text = ": ".join([event, *said]) if event else ": ".join(said)
        if fields:
            text += " (" + ", ".join(f"{k}={_one_line(v)}" for k, v in fields.items()) + ")"
        return text


def _console_filter(minimum: int) -> Any:
    """Drop events below the console level (JSON files saw them already)."""
    levels = logging.getLevelNamesMapping()

    def console_filter(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if levels.get(method_name.upper(), logging.INFO) < minimum:
            raise structlog.DropEvent
        return event_dict

    return console_filter


def configure_logging(console: bool = True, json_path: Path | None = None, level: str = "info") -> None:
    """Configure structlog for the process (the CLI calls this once).

    ``console`` renders events of ``level`` (a logging level name) and above
    to stderr; JSON files get ``info`` and above (or ``level`` if lower).
    ``json_path`` attaches a JSON-lines file for every event (see :func:`add_json_log`).
    """
    global _debug
    console_level = logging.getLevelNamesMapping()[level.upper()]
    if not console:
        console_level = logging.CRITICAL + 1
    _debug = console_level <= logging.DEBUG
    renderer = HumanRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_processor,
            _write_json_logs,
            _console_filter(console_level),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(console_level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=_STDERR),
        cache_logger_on_first_use=False,
    )
    if json_path is not None:
        add_json_log(json_path)


def debug_enabled() -> bool:
    """Whether debug events are logged (the console level is ``debug``)."""
    return _debug


def add_json_log(path: Path, request: str | None = None) -> None:
    """Append every later event (or only ``request``'s) to ``path`` as JSON lines.

    Attaching a path that is already attached does nothing.
    """
    path = Path(path)
    with _lock:
        if path in _json_logs:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        _json_logs[path] = (path.open("a", encoding="utf-8", buffering=1), request)


def remove_json_log(path: Path) -> None:
    """Detach and close ``path`` (no-op when it is not attached)."""
    with _lock:
        entry = _json_logs.pop(Path(path), None)
    if entry is not None:
        with contextlib.suppress(OSError):  # the buffered tail may not fit on a full disk
            entry[0].close()


# Launches running now on the configuration launch_logging made (0: none is ours).
_launches = 0
_ours: Any = None


@contextlib.contextmanager
def launch_logging() -> Iterator[None]:
    """Redacted warnings on stderr while a launch runs, unless something
    configured structlog already (an application's own configuration is left
    alone). Nestable; the last launch to end resets structlog to its defaults,
    unless the application configured it in between."""
    global _launches, _ours, _debug
    with _lock:
        ours = _launches > 0 or not structlog.is_configured()
        if ours:
            if _launches == 0:
                configure_logging(level="warning")
                _ours = structlog.get_config()["processors"]
            _launches += 1
    try:
        yield
    finally:
        if ours:
            with _lock:
                _launches -= 1
                if _launches == 0:
                    if structlog.get_config()["processors"] is _ours:
                        structlog.reset_defaults()
                        _debug = False
                    _ours = None


def get_logger(name: str) -> Any:
    """A structlog logger whose events carry ``logger=name``.

    Getting one configures nothing. Its events are redacted before they reach
    structlog, so no secret passes even through a chain the embedding
    application configured itself. The logger is a lazy proxy: configuring
    structlog after this call still applies to it.
    """
    return _NamedLogger(name)


def _redacted_call(logger: Any, method: str) -> Any:
    def log(event: Any = None, *args: Any, **kw: Any) -> Any:
        if kw.get("exc_info") is True or method == "exception":
            # Render the traceback here so its text is redacted too.
            kw.pop("exc_info", None)
            kw["exception"] = "".join(traceback.format_exception(*sys.exc_info()))
            if method == "exception":
                return logger.error(*_redact_value([event, *args]), **_redact_value(kw))
        return getattr(logger, method)(*_redact_value([event, *args]), **_redact_value(kw))

    return log


class _NamedLogger:
    """A logger resolved at each call, so loggers made at import time follow
    a later :func:`configure_logging` (a bound proxy fixes the level it first saw)."""

    __slots__ = ("_context", "_name")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = context or {}

    def bind(self, **values: Any) -> _NamedLogger:
        return _NamedLogger(self._name, {**self._context, **values})

    def __getattr__(self, method: str) -> Any:
        logger = structlog.get_logger().bind(logger=self._name, **_redact_value(self._context))
        if method in _LEVEL_METHODS:
            return _redacted_call(logger, method)
        return getattr(logger, method)


_LEVEL_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "msg"})
