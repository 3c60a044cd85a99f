"""The one credential redaction: for one-line messages, logs, files and relayed bytes.

:func:`redact` masks two things with ``**********``:

- values the runtime knows are secret: every value passed to
  :func:`register_secret` (the engine registers each ``Secret`` of a request,
  the model pool each key it holds) plus the ``secrets`` argument, as exact
  substrings, in clear and in their JSON-escaped forms. Values shorter than 4
  characters are ignored: masking ``"a"`` everywhere would destroy the text
  and protect nothing.
- credentials recognised by their own shape: ``sk-`` keys (OpenAI,
  Anthropic), the gateway's own ``acgw-`` tokens (every token the runtime
  mints has that prefix), GitHub, Hugging Face, Slack, Google and AWS key
  shapes, JSON Web Tokens, and the password of ``scheme://user:password@host``
  URLs.

It masks values, never a word because of the word before it:
``task vulnerable-secret: ok`` and ``api_key=${OPENAI_API_KEY}`` stay as
they are. A credential of unknown shape that was never registered passes
through: the guarantee is for the values the runtime knows.

The same patterns serve text (:func:`redact`, :func:`redact_json_text`,
which never breaks JSON since no pattern spans a quote or a backslash) and
bytes (:func:`redact_bytes`, for copied session logs and relayed replies;
``agentcompass._gateway._redactor`` applies it to a stream whose secrets
may be split across chunks). The known-value patterns are rebuilt only when
a new secret is registered.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a Secret is told by its reveal(): runtime imports this module
    from .runtime._values import Secret

__all__ = ["MASK", "redact", "redact_bytes", "redact_json_text", "register_secret", "secret_values"]

MASK = "**********"  # the same as Secret.MASK
_MIN_SECRET_LEN = 4

# Self-evident credential shapes. No alternative matches a quote or a
# backslash, so masking JSON text keeps it JSON; each is anchored on its own
# prefix, never on a preceding word.
_SHAPE_SOURCE = r"""
    (?P<url>(?<=://)[^/\s:@"'\\]+:)[^/\s@"'\\]+(?=@)
    | (?<![A-Za-z0-9_])(?:
        sk-[A-Za-z0-9_-]{8,}
      | acgw-[A-Za-z0-9_-]{16,}
      | gh[pousr]_[A-Za-z0-9]{30,}
      | github_pat_[A-Za-z0-9_]{30,}
      | hf_[A-Za-z0-9]{30,}
      | xox[abposr]-[A-Za-z0-9-]{10,}
      | AIza[0-9A-Za-z_-]{35}
      | (?:AKIA|ASIA)[0-9A-Z]{16}
      | eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
    )
"""
_SHAPES = re.compile(_SHAPE_SOURCE, re.VERBOSE)
_BYTE_SHAPES = re.compile(_SHAPE_SOURCE.encode(), re.VERBOSE)
#: The longest prefix a shape needs before it can be told (``github_pat_``).
SHAPE_PREFIX_BYTES = 16
_TRIGGERS = (
    "sk-",
    "acgw-",
    "hp_",
    "ho_",
    "hu_",
    "hs_",
    "hr_",
    "github_pat_",
    "hf_",
    "xox",
    "AIza",
    "AKIA",
    "ASIA",
    "eyJ",
    "://",
)

_lock = threading.Lock()
_registered: set[str] = set()
_text_pattern: re.Pattern[str] | None = None
_bytes_pattern: re.Pattern[bytes] | None = None


def _forms(value: str) -> set[str]:
    """``value`` as it may appear in text: in clear and JSON-escaped (ASCII or not)."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}


def _sorted_forms(values: Iterable[str]) -> list[str]:
    # Longest first, so a secret that contains another is masked whole.
    forms = {form for v in values if len(v) >= _MIN_SECRET_LEN for form in _forms(v)}
    return sorted(forms, key=len, reverse=True)


def _text_values(values: Iterable[str]) -> re.Pattern[str] | None:
    forms = _sorted_forms(values)
    return re.compile("|".join(re.escape(v) for v in forms)) if forms else None


def _byte_values(values: Iterable[str]) -> re.Pattern[bytes] | None:
    forms = _sorted_forms(values)
    return re.compile(b"|".join(re.escape(v.encode("utf-8", "surrogatepass")) for v in forms)) if forms else None


def register_secret(value: str | Secret) -> None:
    """Make every redaction mask ``value`` (or a ``Secret``'s clear value) from now on."""
    global _text_pattern, _bytes_pattern
    text = value if isinstance(value, str) else value.reveal()
    if len(text) < _MIN_SECRET_LEN:
        return
    with _lock:
        if text in _registered:
            return
        _registered.add(text)
        _text_pattern = _text_values(_registered)
        _bytes_pattern = _byte_values(_registered)


def secret_values() -> frozenset[str]:
    """The registered secret values (for a redactor that must know their lengths)."""
    with _lock:
        return frozenset(_registered)


def _replace_shape(match: re.Match[str]) -> str:
    kept = match.group("url")
    return MASK if kept is None else kept + MASK


def _replace_byte_shape(match: re.Match[bytes]) -> bytes:
    kept = match.group("url")
    return _BYTE_MASK if kept is None else kept + _BYTE_MASK


_BYTE_MASK = MASK.encode()


def redact(text: str, secrets: Iterable[str | Secret] = ()) -> str:
    """``text`` with registered secrets, ``secrets`` and credential-shaped
    substrings replaced by ``**********``."""
    pattern = _text_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    extra = [s if isinstance(s, str) else s.reveal() for s in secrets]
    if extra:
        extra_pattern = _text_values(extra)
        if extra_pattern is not None:
            text = extra_pattern.sub(MASK, text)
    if not _may_hold_shapes(text):
        return text
    return _SHAPES.sub(_replace_shape, text)


# A string value of a ``Secret`` field (``ModelSpec.api_key``, a provider's
# ``token``) where a writer forgot to mask it: the field is the schema's, not
# a word in a text. A ``${VAR}`` reference names where the value lives and is kept.
_SECRET_FIELDS = re.compile(r'("(?:api_key|token)"\s*:\s*")(?!\$\{[A-Za-z_][A-Za-z0-9_]*\}")[^"\\]+(?=")')


def redact_json_text(text: str) -> str:
    """JSON ``text`` with registered secrets and credential-shaped substrings
    masked, still valid JSON (a secret is masked in its escaped form too), and
    the string value of every ``api_key`` or ``token`` member (the names of
    the schema's ``Secret`` fields) but a ``${VAR}`` reference."""
    text = redact(text)
    if '"api_key"' in text or '"token"' in text:
        text = _SECRET_FIELDS.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact_bytes(data: bytes, secrets: Iterable[str] = ()) -> bytes:
    """:func:`redact` for bytes (a copied log, a relayed reply): registered
    secrets, ``secrets`` and shapes masked wherever their UTF-8 bytes appear."""
    pattern = _bytes_pattern
    if pattern is not None:
        data = pattern.sub(_BYTE_MASK, data)
    extra = list(secrets)
    if extra:
        extra_pattern = _byte_values(extra)
        if extra_pattern is not None:
            data = extra_pattern.sub(_BYTE_MASK, data)
    return _BYTE_SHAPES.sub(_replace_byte_shape, data)


def _may_hold_shapes(text: str) -> bool:
    """A cheap test that ``_SHAPES`` can match at all: substring checks cost far less than the pattern."""
    return any(map(text.__contains__, _TRIGGERS))
