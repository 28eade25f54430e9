"""Split text into segments the model speaks one at a time, with offsets into the input.

Sentence boundaries come from sentencex (abbreviations, decimals, ellipses, quotes, Latin and
CJK terminators). A sentence longer than `max_chars` is cut at clause punctuation, then at
whitespace, then (text without spaces, e.g. CJK) at the limit itself, never inside an inline
tag. A piece holding only tags and whitespace joins the next piece (or the previous one, at the
end), so a tag always travels with the speech it modifies. Each segment's `model_text` carries
the delivery tags in force from earlier segments (text/tags.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sentencex import get_sentence_boundaries

from higgs_serve.text.tags import TAG, delivery_state, tag_spans, with_carried_tags

LANGUAGE = "en"  # sentencex's English rules also end sentences at 。！？ (tested)
CLAUSE_BREAK = re.compile(r"[,;:，；：、—)\]]\s*|\s[-–]\s")


@dataclass(frozen=True)
class Segment:
    start: int  # character offset of the segment's first character in the input
    end: int  # offset one past its last character (surrounding whitespace excluded)
    text: str  # input[start:end]
    model_text: str  # what the model is asked to speak: carried delivery tags + text


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[(start, end)] of each sentence, whitespace trimmed, whitespace-only pieces dropped."""
    spans = []
    for boundary in get_sentence_boundaries(LANGUAGE, text):
        span = _trim(text, boundary["start_index"], boundary["end_index"])
        if span is not None:
            spans.append(span)
    return spans


def _trim(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def split_long(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut text[start:end] into spans of at most max_chars (clause, then space, then hard)."""
    pieces = []
    while end - start > max_chars:
        cut = _cut_point(text, start, start + max_chars)
        span = _trim(text, start, cut)
        if span is not None:
            pieces.append(span)
        start = cut
    span = _trim(text, start, end)
    return pieces + ([span] if span is not None else [])


def _cut_point(text: str, start: int, limit: int) -> int:
    """The last clause break, else the last whitespace, else `limit` itself, in (start, limit];
    moved before any inline tag that would straddle it."""
    window = text[start:limit + 1]
    clauses = [m.end() for m in CLAUSE_BREAK.finditer(window) if m.end() <= limit - start]
    spaces = [i + 1 for i, ch in enumerate(window[:limit - start]) if ch.isspace()]
    floor = (limit - start) // 3  # never cut so early that pieces become tiny
    for candidates in (clauses, spaces):
        good = [c for c in candidates if c > floor]
        if good:
            return _outside_tags(text, start, start + good[-1])
    return _outside_tags(text, start, limit)


def _outside_tags(text: str, start: int, cut: int) -> int:
    for tag_start, tag_end in tag_spans(text):
        if tag_start < cut < tag_end:
            return tag_start if tag_start > start else tag_end
    return cut


def _only_tags(text: str) -> bool:
    return not TAG.sub("", text).strip()


def _attach_tag_only(spans: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
    """Merge spans holding nothing but tags into the following span (the last into the previous)."""
    merged: list[tuple[int, int]] = []
    carry: int | None = None
    for start, end in spans:
        if _only_tags(text[start:end]):
            carry = start if carry is None else carry
            continue
        merged.append((start if carry is None else carry, end))
        carry = None
    if carry is not None:
        if merged:
            merged[-1] = (merged[-1][0], spans[-1][1])
        else:
            merged.append((carry, spans[-1][1]))
    return merged


def spans_of(text: str, max_chars: int) -> list[tuple[int, int]]:
    """Sentence spans of `text`, each at most max_chars (long ones split), tags attached."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    spans = []
    for start, end in sentence_spans(text):
        spans.extend(split_long(text, start, end, max_chars))
    return _attach_tag_only(spans, text)


def to_segments(text: str, spans: list[tuple[int, int]], offset: int = 0,
                state: dict[str, str] | None = None) -> tuple[list[Segment], dict[str, str]]:
    """Segments for `spans` of `text` (offsets shifted by `offset`), carrying delivery tags from
    `state`; returns them and the state after the last one."""
    state = dict(state or {})
    segments = []
    for start, end in spans:
        piece = text[start:end]
        segments.append(Segment(start + offset, end + offset, piece,
                                with_carried_tags(piece, state)))
        state = delivery_state(piece, state)
    return segments, state


def segment_text(text: str, max_chars: int) -> list[Segment]:
    """One segment per sentence (long sentences split to max_chars)."""
    segments, _ = to_segments(text, spans_of(text, max_chars))
    return segments


def group_segments(text: str, max_chars: int) -> list[Segment]:
    """Sentences packed greedily into segments of at most max_chars (the span from the first
    sentence's start to the last one's end), for long-form requests: fewer, fuller segments."""
    groups: list[tuple[int, int]] = []
    for start, end in spans_of(text, max_chars):
        if groups and end - groups[-1][0] <= max_chars:
            groups[-1] = (groups[-1][0], end)
        else:
            groups.append((start, end))
    segments, _ = to_segments(text, groups)
    return segments
