"""Credential redaction for one-line messages, logs and files.

:func:`redact` masks two things with ``**********``:

- secret values the runtime knows: every value passed to
  :func:`register_secret` (the engine registers each ``Secret`` of a request)
  plus the ``secrets`` argument, as exact substrings. Values shorter than 4
  characters are ignored: masking ``"a"`` everywhere would destroy the text
  and protect nothing.
- credentials recognized by shape: ``sk-`` tokens, ``Bearer <token>``,
  ``Authorization: ...`` headers, key/value pairs whose key names a
  credential (``api_key=...``, ``"api-key": "..."``, an ``x-api-key:``
  header as Anthropic's API takes the key, ``token=...``,
  ``password: ...``, ``secret=...``; the key is kept, the value masked) and the
  password of ``scheme://user:password@host`` URLs. A value that is a
  whole ``${VAR}`` reference is kept: it names where the credential lives,
  which is how a ``Secret`` read from the environment serializes.

It is a safety net, not a guarantee: a credential of unknown shape that was
never registered passes through. Patterns are compiled once; the known-value
pattern is rebuilt only when a new secret is registered, so redacting a
short message costs a few regex scans.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a Secret is told by its reveal(): runtime imports this module
    from .runtime._values import Secret

__all__ = ["MASK", "redact", "redact_json_text", "register_secret"]

MASK = "**********"  # the same as Secret.MASK
_MIN_SECRET_LEN = 4

_SHAPES = re.compile(
    r"""
    (?P<url>(?<=://)[^/\s:@]+:)[^/\s@]+(?=@)
    | (?P<sk>\bsk-[A-Za-z0-9_-]{8,})
    | (?P<scheme>\bBearer\s+)[A-Za-z0-9._~+/=-]+
    | (?P<header>\bAuthorization\s*:\s*)[^\r\n"']+
    | (?P<key>(?<![A-Za-z0-9])[A-Za-z0-9_-]*?
              (?:api[_-]?key|token|password|passwd|secret|authorization)
              (?![A-Za-z0-9_])["']?\s*[:=]\s*["']?)
      (?!\$\{[A-Za-z_][A-Za-z0-9_]*\}(?![^\s"',;&\]]))
      (?:(?:Bearer|Basic|Token)\s+)?[^\s"',;&}\]]+
    """,
    re.IGNORECASE | re.VERBOSE,
)

# The same shapes for JSON text, never breaking it: a value is masked only
# inside a string (it stops at quotes and backslashes), and a key/value pair
# only when the value is a quoted string or follows "=" inside a string, so
# ``"max_token": 5`` stays valid JSON. The key alternative starts at the
# keyword itself (a prefix such as ``my_`` is kept either way), so the scan
# does not try a prefix at every position.
_JSON_SHAPES = re.compile(
    r"""
    (?P<url>(?<=://)[^/\s:@"\\]+:)[^/\s@"\\]+(?=@)
    | (?P<sk>\bsk-[A-Za-z0-9_-]{8,})
    | (?P<scheme>\bBearer\s+)[A-Za-z0-9._~+/=-]+
    | (?P<header>\bAuthorization\s*:\s*)[^\r\n"'\\]+
    | (?P<key>(?:api[_-]?key|token|password|passwd|secret|authorization)
              (?![A-Za-z0-9_])(?:\s*=\s*|\\?"\s*:\s*\\?"))
      (?!\$\{[A-Za-z_][A-Za-z0-9_]*\}(?![^\s"',;&\]\\]))
      (?:(?:Bearer|Basic|Token)\s+)?[^\s"',;&}\]\\]+
    """,
    re.IGNORECASE | re.VERBOSE,
)

_lock = threading.Lock()
_registered: set[str] = set()
_registered_pattern: re.Pattern[str] | None = None


def _replace_shape(match: re.Match[str]) -> str:
    # The named group, when present, is the part of the match that is kept.
    for group in ("url", "scheme", "header", "key"):
        kept = match.group(group)
        if kept is not None:
            return kept + MASK
    return MASK


def _values_pattern(values: Iterable[str]) -> re.Pattern[str] | None:
    # Longest first, so a secret that contains another is masked whole.
    usable = sorted({v for v in values if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)
    if not usable:
        return None
    return re.compile("|".join(re.escape(v) for v in usable))


def register_secret(value: str | Secret) -> None:
    """Make :func:`redact` mask ``value`` (or a ``Secret``'s clear value) from now on."""
    global _registered_pattern
    text = value if isinstance(value, str) else value.reveal()
    if len(text) < _MIN_SECRET_LEN:
        return
    with _lock:
        if text in _registered:
            return
        _registered.add(text)
        _registered_pattern = _values_pattern(_registered)


def redact(text: str, secrets: Iterable[str | Secret] = ()) -> str:
    """``text`` with registered secrets, ``secrets`` and credential-shaped
    substrings replaced by ``**********``."""
    pattern = _registered_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    extra = [s if isinstance(s, str) else s.reveal() for s in secrets]
    if extra:
        extra_pattern = _values_pattern(extra)
        if extra_pattern is not None:
            text = extra_pattern.sub(MASK, text)
    if not _may_hold_credentials(text):  # every shape needs one of its triggers
        return text
    return _SHAPES.sub(_replace_shape, text)


_TRIGGERS = ("bearer", "authorization", "key", "passw", "secret", "://")


def _may_hold_credentials(text: str) -> bool:
    """A cheap test that ``_SHAPES`` or ``_JSON_SHAPES`` can match at all (substring checks
    are far cheaper than the full pattern). ``token`` counts only as a whole word end
    (not ``input_tokens``), ``sk-`` only at a word start (not ``task-1``), as the
    patterns have them."""
    low = text.lower()
    if any(trigger in low for trigger in _TRIGGERS):
        return True
    i = low.find("sk-")
    while i != -1:
        before = low[i - 1 : i]
        if not (before.isalnum() or before == "_"):
            return True
        i = low.find("sk-", i + 3)
    i = low.find("token")
    while i != -1:
        following = low[i + 5 : i + 6]
        if not (following.isalnum() or following == "_"):
            return True
        i = low.find("token", i + 5)
    return False


def redact_json_text(text: str) -> str:
    """JSON ``text`` with registered secrets and credential-shaped substrings
    masked, still valid JSON (see ``_JSON_SHAPES``)."""
    pattern = _registered_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    if not _may_hold_credentials(text):
        return text
    return _JSON_SHAPES.sub(_replace_shape, text)
