"""JSON shape limits: a body or WebSocket message is measured before it is parsed.

The byte limits (body_limit.py, the WebSocket message cap) bound how much text arrives, not how
much work parsing it is: `json.loads` builds one Python object per value, on the event loop
(FastAPI parses request bodies there) and holding the GIL (so a worker thread would not help).
15 MB of `{"k0":0,"k1":0,...}` took 1.9 s to parse, 15 MB of `[[],[],...]` 1.2 s, 15 MB of
base64 in one string 0.02 s. And `"[" * 99999` raises RecursionError from inside the parser.

`check_json_shape` counts what parsing would build from the raw text, in a few passes of C-level
string methods (no Python loop over the characters): string escapes are dropped (`\\\\`, then
`\\"`), the strings are counted and cut out, and what is left (the structure, numbers and
literals) is counted. It refuses past these limits, none of which a valid request comes near
(a batch of 32 items, each with 750 rows of reference codes, holds about 24,000 arrays and
200,000 values; nothing is nested deeper than 5):

    MAX_DEPTH       16 nested arrays/objects
    MAX_CONTAINERS  65,536 arrays and objects
    MAX_MEMBERS     16,384 object members
    MAX_VALUES      1,048,576 values (from the commas and openers), and as many strings

At those limits the parse costs at most about 0.1 s, and the check itself at most about 0.1 s
for a 15 MB text (CPU, measured by benchmarks/limits/bench_fuzz_surfaces.py). The answer says which limit
was passed: `JsonTooDeepError` (REST 400 / WebSocket `invalid_json`), `JsonTooLargeError`
(REST 413 / WebSocket `message_too_large`).
"""

from __future__ import annotations

import re
from typing import AnyStr

MAX_DEPTH = 16
MAX_CONTAINERS = 65_536
MAX_MEMBERS = 16_384
MAX_VALUES = 1_048_576

_STRINGS = {str: re.compile('"[^"]*"'), bytes: re.compile(b'"[^"]*"')}  # escapes already gone
_NOT_BRACKETS = {str: re.compile(r"[^\[\]{}]+"), bytes: re.compile(rb"[^\[\]{}]+")}
_INNERMOST = {str: re.compile(r"\[\]|\{\}"), bytes: re.compile(rb"\[\]|\{\}")}


class JsonShapeError(ValueError):
    """The text would be too costly to parse; the message says which limit it passed."""


class JsonTooDeepError(JsonShapeError):
    pass


class JsonTooLargeError(JsonShapeError):
    pass


def check_json_shape(text: AnyStr) -> None:
    """Raise a JsonShapeError if parsing `text` would pass a limit (module doc). Text that is not
    valid JSON may pass: the parser then refuses it, at a cost these counts still bound."""
    kind = type(text)
    backslash, quote = ("\\", '"') if kind is str else (b"\\", b'"')
    if backslash in text:  # escaped backslashes first (JSON reads escapes left to right)
        text = text.replace(backslash + backslash, text[:0]).replace(backslash + quote, text[:0])
    strings = text.count(quote) // 2
    if strings > MAX_VALUES:
        raise JsonTooLargeError(f"more than {MAX_VALUES} strings")
    skeleton = _STRINGS[kind].sub(text[:0], text)  # structure, numbers and literals
    open_ = ("[", "{") if kind is str else (b"[", b"{")
    # MAX_DEPTH + 1 openers in a row ("[[[[..."): too deep, found by a substring search; other
    # deep shapes are found by the full depth check below, once the counts have bounded its work
    if any(opener * (MAX_DEPTH + 1) in skeleton for opener in open_):
        raise JsonTooDeepError(f"nested more than {MAX_DEPTH} levels deep")
    containers = skeleton.count(open_[0]) + skeleton.count(open_[1])
    if containers > MAX_CONTAINERS:
        raise JsonTooLargeError(f"more than {MAX_CONTAINERS} arrays and objects")
    if skeleton.count(":" if kind is str else b":") > MAX_MEMBERS:
        raise JsonTooLargeError(f"more than {MAX_MEMBERS} object members")
    # every value but the outermost follows a comma or an opener
    if skeleton.count("," if kind is str else b",") + containers + 1 > MAX_VALUES:
        raise JsonTooLargeError(f"more than {MAX_VALUES} values")
    _check_depth(_NOT_BRACKETS[kind].sub(text[:0], skeleton))  # at most 2 * MAX_CONTAINERS left


def _check_depth(brackets: AnyStr) -> None:
    """Strip innermost pairs MAX_DEPTH times (at most 2 * MAX_CONTAINERS characters each time):
    a pair still left was nested deeper. Unbalanced text is left to the parser."""
    innermost = _INNERMOST[type(brackets)]
    for _ in range(MAX_DEPTH):
        reduced = innermost.sub(brackets[:0], brackets)
        if len(reduced) == len(brackets):
            return
        brackets = reduced
    if innermost.search(brackets):
        raise JsonTooDeepError(f"nested more than {MAX_DEPTH} levels deep")
