"""The redaction of a relayed byte stream, a secret split across its chunks included.

:class:`StreamRedactor` applies :func:`agentcompass._redact.redact_bytes`
(the registered secrets, the model's own key, credential shapes) to a reply
as it is relayed. A chunk is released only up to a point no match can
straddle: the last bytes (as many as the longest secret, or a shape's
prefix) wait for the next chunk, and so does a match that straddles that
point (up to :data:`_SHAPE_HOLD` bytes of it), so a secret is masked whole. The
output is what :func:`redact_bytes` gives for the whole stream at once.
Non-goal: a secret that the upstream spreads over several events of a
stream (a chat completion's deltas) reaches the agent's parser in pieces no
byte scan can see; only an upstream that echoes credentials would do that.
"""

from __future__ import annotations

from .._redact import _BYTE_SHAPES, SHAPE_PREFIX_BYTES, _byte_values, redact_bytes, secret_values

__all__ = ["StreamRedactor"]

#: How long a shape reaching a chunk's end may be held back whole.
_SHAPE_HOLD = 1024


class StreamRedactor:
    """Redact a stream chunk by chunk: :meth:`feed` each chunk, then :meth:`end`."""

    def __init__(self, secrets: tuple[str, ...] = ()):
        self._secrets = secrets
        values = secret_values() | set(secrets)
        self._values = _byte_values(values)
        longest = max((len(v.encode("utf-8", "surrogatepass")) * 6 for v in values), default=0)
        # JSON escapes make a form up to six bytes a character.
        self._hold = max(longest, SHAPE_PREFIX_BYTES)
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The redacted bytes of ``chunk`` (with what was held back) that can go out now."""
        data = self._tail + chunk
        cut = max(0, len(data) - self._hold)
        # A match may hold the cut back only this far, so the tail stays bounded.
        scan = max(0, len(data) - self._hold - _SHAPE_HOLD)
        moved = True
        while moved and cut:
            moved = False
            for pattern in (self._values, _BYTE_SHAPES):
                for match in pattern.finditer(data, scan) if pattern is not None else ():
                    start, end = match.span()
                    if start < cut < end:
                        cut, moved = start, True
        self._tail = data[cut:]
        return redact_bytes(data[:cut], self._secrets) if cut else b""

    def end(self) -> bytes:
        """The rest, redacted: the stream ended."""
        data, self._tail = self._tail, b""
        return redact_bytes(data, self._secrets) if data else b""
