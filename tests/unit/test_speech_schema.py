"""server/schemas.py: size checks come before the work that grows with the input (issue 40)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from higgs_serve.server.schemas import SpeechRequestBody
from higgs_serve.voices.codes_file import MAX_REFERENCE_FRAMES


def _error(body: dict) -> dict:
    with pytest.raises(ValidationError) as caught:
        SpeechRequestBody.model_validate({"input": "hi", **body})
    return caught.value.errors()[0]


def test_too_many_reference_code_rows_are_refused_before_any_row_is_validated():
    """Item 2: 820,000 rows were validated element by element (1.9 s on the event loop) before
    the 750-row cap was looked at. The row count is checked on the raw list first: a bad value
    past the cap is never even seen, and the refusal costs the same whatever the length."""
    rows = [[1] * 8] * (MAX_REFERENCE_FRAMES + 1)
    error = _error({"reference_codes": [["not a code"] * 8] + rows})
    assert error["loc"] == ("reference_codes",) and "1-750 frames" in error["msg"]
    huge = [[1] * 8] * 820_000
    started = time.perf_counter()
    error = _error({"reference_codes": huge})
    assert time.perf_counter() - started < 0.05  # was ~1.9 s; the check is O(1) in the rows
    assert "got 820000" in error["msg"]


def test_a_row_of_the_wrong_length_is_refused_before_its_values_are_validated():
    error = _error({"reference_codes": [[1] * 8, ["x"] * 100_000]})
    assert error["loc"] == ("reference_codes",) and "frame 1 has 100000 codes" in error["msg"]
