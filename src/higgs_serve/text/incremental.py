"""Sentences out of text that arrives in pieces (an LLM's token stream).

A sentence is released once enough text after it exists: the segmenter must see what follows a
period to know it ends a sentence ("Dr. Smith", "3.14"), and an opening quote right after a
sentence reads as a closing one until the quoted words arrive; so the last sentence of the buffer
waits for more text or for `flush`, and the ones before it wait until the last one holds
LOOKAHEAD_CHARS visible characters. Straight double quotes pair up only once both have arrived,
so a boundary with an odd number of `"` before it is not trusted yet. Released sentences are the
ones `segment_text` gives for the whole text (tested on real text, fed a character at a time and
in larger pieces), and offsets count from the start of the session's text. Text past
`max_buffer_chars` is released whatever it ends with, so a producer that never ends a sentence
(or never closes a quote) cannot grow the buffer without bound. A piece of whitespace alone
cannot make a sentence releasable, so it is appended without segmenting the buffer again, and
whitespace with no text before it is dropped (each such piece cost a segmentation of the whole
buffer before).
"""

from __future__ import annotations

from higgs_serve.text.segmenter import Segment, spans_of, to_segments

LOOKAHEAD_CHARS = 6  # about two LLM tokens of the next sentence


class IncrementalSegmenter:
    def __init__(self, max_chars: int, max_buffer_chars: int | None = None):
        self.max_chars = max_chars
        # pending text longer than this is force-segmented (a producer that never ends a sentence)
        self.max_buffer_chars = max_buffer_chars or 4 * max_chars
        self._buffer = ""
        self._offset = 0  # session offset of _buffer[0]
        self._state: dict[str, str] = {}

    @property
    def pending_chars(self) -> int:
        return len(self._buffer)

    def feed(self, text: str) -> list[Segment]:
        """Add text; returns the sentences now known to be complete."""
        if not text.isspace() and text:
            self._buffer += text
        elif not self._buffer or self._buffer.isspace():
            # whitespace before any text is never part of a segment: dropped, offsets kept
            self._offset += len(self._buffer) + len(text)
            self._buffer = ""
            return []
        else:
            # whitespace adds no visible character: nothing becomes releasable (LOOKAHEAD_CHARS,
            # quotes), so the buffer is not segmented again unless it outgrew its bound
            self._buffer += text
            if len(self._buffer) <= self.max_buffer_chars:
                return []
        spans = spans_of(self._buffer, self.max_chars)
        if not spans:
            return []
        if len(self._buffer) > self.max_buffer_chars:
            # a producer that never ends its sentence or never closes its quote: out it goes,
            # all but a last piece that may still grow
            if len(spans) == 1:
                return self._release(spans, len(self._buffer))
            return self._release(spans[:-1], spans[-1][0])
        if len(spans) == 1 or _visible(self._buffer[spans[-1][0]:]) < LOOKAHEAD_CHARS:
            return []
        # the last span may still grow; those before it are final up to the last trusted boundary
        ready = [i for i in range(1, len(spans)) if self._buffer[:spans[i][0]].count('"') % 2 == 0]
        if not ready:
            return []
        return self._release(spans[:ready[-1]], spans[ready[-1]][0])

    def flush(self) -> list[Segment]:
        """Everything buffered, as segments; the segmenter then starts empty (state kept)."""
        spans = spans_of(self._buffer, self.max_chars)
        return self._release(spans, len(self._buffer))

    def _release(self, spans: list[tuple[int, int]], keep_from: int) -> list[Segment]:
        segments, self._state = to_segments(self._buffer, spans, self._offset, self._state)
        self._buffer = self._buffer[keep_from:]
        self._offset += keep_from
        return segments


def _visible(text: str) -> int:
    return sum(not ch.isspace() for ch in text)
