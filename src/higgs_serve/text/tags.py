"""Inline control tags (`<|emotion:happy|>`, `<|prosody:pause|>`, `<|sfx:cough|>`): which ones
are a state that later segments inherit, and which are one-off events.

Delivery tags (emotion, style, and the prosody speed/pitch/expressiveness tags) set how the rest
of a turn is spoken; the model reads them at the start of its text. When long input is split, a
segment that follows one where such a tag was in force gets the tag prepended to the text the
model sees, so the delivery carries on. Pauses and sound effects are events at their spot in the
text and are never repeated.
"""

from __future__ import annotations

import re

TAG = re.compile(r"<\|([a-z_]+):([A-Za-z0-9_\-]+)\|>")
EVENT_PROSODY = frozenset({"pause", "long_pause"})


def tag_spans(text: str) -> list[tuple[int, int]]:
    """[(start, end)] character spans of every inline tag in `text`."""
    return [match.span() for match in TAG.finditer(text)]


def _state_key(kind: str, value: str) -> str | None:
    """The state slot a delivery tag sets, or None for an event tag."""
    if kind in ("emotion", "style"):
        return kind
    if kind == "prosody" and value not in EVENT_PROSODY:
        # speed_* and pitch_* / expressive_* are independent knobs
        return f"prosody:{value.split('_', 1)[0]}"
    return None


def delivery_state(text: str, state: dict[str, str] | None = None) -> dict[str, str]:
    """The delivery tags in force after `text`, starting from `state`: {slot: tag text}."""
    result = dict(state or {})
    for match in TAG.finditer(text):
        key = _state_key(match.group(1), match.group(2))
        if key is not None:
            result[key] = match.group(0)
    return result


def with_carried_tags(text: str, state: dict[str, str]) -> str:
    """`text` with the inherited delivery tags prepended, except slots `text` sets itself before
    any speech (a segment that opens with its own emotion tag overrides the carried one)."""
    leading = re.match(r"\s*((?:<\|[^|]*\|>\s*)*)", text).group(1)
    own = delivery_state(leading)
    carried = "".join(tag for key, tag in state.items() if key not in own)
    return carried + text
