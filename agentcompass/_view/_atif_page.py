"""The viewer's page of one ATIF file (``compass view FILE``): a trajectory from anywhere.

Rendered on the server as plain HTML, every value escaped (the file is
whoever wrote it's): the agent and its model, the final metrics (tokens,
cost), what the shipped schema finds wrong with it, and per step its source,
message, tool calls with their arguments, observations and metrics.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .._atif import validate

__all__ = ["MAX_ATIF_BYTES", "atif_page"]

#: The largest ATIF file the viewer reads.
MAX_ATIF_BYTES = 64 * 1024 * 1024
#: Characters of one message or observation shown (the rest is cut, with a count).
_TEXT = 20000


def atif_page(path: Path) -> bytes:
    """The page of the ATIF file at ``path`` (its problems shown, never raised)."""
    title = f"ATIF · {path.name}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ATIF_BYTES + 1)
        if len(data) > MAX_ATIF_BYTES:
            raise ValueError(f"larger than {MAX_ATIF_BYTES} bytes")
        document = json.loads(data)
    except (OSError, ValueError) as exc:
        return _page(title, [f"<p class='bad' id='atif-error'>cannot read {_e(path)}: {_e(exc)}</p>"])
    problems = validate(document)
    parts = [f"<h1>{_e(path.name)} <span class='muted mono'>{_e(document.get('schema_version', '?'))}</span></h1>"]
    if problems:
        parts.append("<div class='panel' id='atif-problems'><h2>Not valid ATIF</h2><ul>")
        parts += [f"<li class='mono'>{_e(p)}</li>" for p in problems]
        parts.append("</ul></div>")
    else:
        parts.append("<p class='muted' id='atif-valid'>Valid against the shipped ATIF v1.7 schema.</p>")
    if isinstance(document, dict):
        parts += _summary(document)
        steps = document.get("steps")
        parts += [_step(s) for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    return _page(title, parts)


def _summary(document: dict[str, Any]) -> list[str]:
    agent = found if isinstance(found := document.get("agent"), dict) else {}
    final = metrics if isinstance(metrics := document.get("final_metrics"), dict) else {}
    cost = final.get("total_cost_usd")
    cards = [
        ("agent", f"{agent.get('name', '?')} {agent.get('version', '')}", "atif-agent"),
        ("model", agent.get("model_name") or "-", "atif-model"),
        ("steps", final.get("total_steps", len(document.get("steps") or [])), "atif-steps"),
        (
            "tokens",
            f"{final.get('total_prompt_tokens', 0)} prompt · {final.get('total_completion_tokens', 0)} completion",
            "atif-tokens",
        ),
        ("cost", "unknown" if cost is None else f"${cost:.6f}", "atif-cost"),
    ]
    return [
        "<div class='cards'>",
        *(
            f"<div class='card' id='{i}'><div class='k'>{_e(k)}</div><div class='v'>{_e(v)}</div></div>"
            for k, v, i in cards
        ),
        "</div>",
    ]


def _step(step: dict[str, Any]) -> str:
    source = str(step.get("source", "?"))
    out = [f"<div class='panel atif-step' data-source='{_e(source)}'>"]
    out.append(f"<h2>step {_e(step.get('step_id'))} · {_e(source)}</h2>")
    out.append(f"<pre class='msg'>{_e(_cut(step.get('message')))}</pre>")
    for call in step.get("tool_calls") or ():
        if isinstance(call, dict):
            arguments = json.dumps(call.get("arguments"), ensure_ascii=False, indent=1)
            out.append(
                f"<div class='tool-call'><b class='mono'>{_e(call.get('function_name'))}</b> "
                f"<span class='muted mono'>{_e(call.get('tool_call_id'))}</span><pre>{_e(_cut(arguments))}</pre></div>"
            )
    observation = step.get("observation")
    for result in observation.get("results") or () if isinstance(observation, dict) else ():
        if isinstance(result, dict):
            out.append(
                f"<div class='observation'><span class='muted mono'>{_e(result.get('source_call_id') or '')}</span>"
                f"<pre>{_e(_cut(result.get('content')))}</pre></div>"
            )
    metrics = step.get("metrics")
    if isinstance(metrics, dict):
        shown = {
            k: metrics[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd") if k in metrics
        }
        out.append(f"<p class='muted mono metrics'>{_e(json.dumps(shown))}</p>")
    out.append("</div>")
    return "".join(out)


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _TEXT else text[:_TEXT] + f"\n[{len(text) - _TEXT} more characters]"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, parts: list[str]) -> bytes:
    head = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><link rel='icon' href='data:,'><link rel='stylesheet' href='../app.css'></head><body><main id='atif'>"
    )
    return (head + "".join(parts) + "</main></body></html>").encode()
