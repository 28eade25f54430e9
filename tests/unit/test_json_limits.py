"""server/limits/json_limits.py: what parsing a JSON text would build is counted before it is parsed."""

from __future__ import annotations

import json
import time

import pytest

from higgs_serve.server.limits.json_limits import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_MEMBERS,
    MAX_VALUES,
    JsonTooDeepError,
    JsonTooLargeError,
    check_json_shape,
)


def _both(text: str):
    return [text, text.encode()]


@pytest.mark.parametrize("document", [
    {"input": "hello", "reference_codes": [[1] * 8] * 750, "references": [{"data": "QUJD", "text": "t"}]},
    {"items": [{"input": "x", "reference_codes": [[1023] * 8] * 750} for _ in range(32)]},
    {"input": '"[[[[[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{{{{{{{{{{{::::,,,,\\\\\\"' * 1000},
    {"ref_audio": "A" * 3_000_000, "ref_text": "[" * 100_000},
    "[" * 50,  # a string, not an array
    [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]],  # exactly MAX_DEPTH deep
])
def test_valid_requests_pass(document):
    for text in _both(json.dumps(document)):
        check_json_shape(text)


@pytest.mark.parametrize("text, error, words", [
    ("[" * 99_999, JsonTooDeepError, "16 levels"),  # issue 40 item 4: a RecursionError before
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), JsonTooDeepError, "16 levels"),
    ('{"a":' * 17 + "1" + "}" * 17, JsonTooDeepError, "16 levels"),
    ("[" + "[[[[[[[[1]]]]]]]]," * 3 + "[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]" + "]", JsonTooDeepError, "16"),
    ("[" + ",".join(["[]"] * (MAX_CONTAINERS + 1)) + "]", JsonTooLargeError, "arrays and objects"),
    ("{" + ",".join(f'"{i}":0' for i in range(MAX_MEMBERS + 1)) + "}", JsonTooLargeError, "members"),
    ("[" + ",".join(["1"] * (MAX_VALUES + 1)) + "]", JsonTooLargeError, "values"),
    ("[" + ",".join(['""'] * (MAX_VALUES + 1)) + "]", JsonTooLargeError, "strings"),
])
def test_costly_shapes_are_refused(text, error, words):
    for form in _both(text):
        with pytest.raises(error, match=words):
            check_json_shape(form)


def test_escaped_quotes_and_backslashes_are_read_as_the_parser_reads_them():
    # "\\" is one backslash: the quote after it closes the string, so the brackets are structure
    deep = '["\\\\",' + "[" * 17 + "]" * 17 + "]"
    assert json.loads(deep)
    with pytest.raises(JsonTooDeepError):
        check_json_shape(deep)
    # \" inside a string: the brackets after it are still text
    check_json_shape('["\\"' + "[" * 40 + '"]')


def test_the_check_is_cheap_for_the_largest_bodies():
    """A 15 MB worst case is measured in a few C-level passes (about 20-90 ms on CPU, see
    benchmarks/results/fuzz_surfaces_cpu.json); the bound here is loose for shared machines."""
    hostile = "[" + ",".join(["[]"] * 5_000_000) + "]"
    started = time.perf_counter()
    with pytest.raises(JsonTooLargeError):
        check_json_shape(hostile)
    assert time.perf_counter() - started < 1.0
