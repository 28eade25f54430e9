"""Small value checks shared by every typed config: the deploy profile (`config.loader`,
`config.reader`), the checkpoint's config.json (`model/hf_config`, `codec/codec_config`) and a
request's sampling knobs (`sampling_params`).

Two kinds: predicates (`is_int`, `is_real`) for parsers that phrase their own error, and
`*_problem(value)` checkers that return why a value is invalid (a phrase the caller prefixes with
the field, file or request parameter) or None. JSON and YAML both give `true` as a bool, which
Python counts as an int: every integer check here refuses bools.
"""

from __future__ import annotations

import math
from typing import Any

TEMPERATURE_MAX = 2.0
TOP_K_MAX = 1026  # per-codebook vocabulary: 1024 real codes + BOC + EOC
SEED_MAX = 2**63 - 1  # seeds feed a signed 64-bit counter-based RNG


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """An int or float that is not a bool (NaN and infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    return is_real(value) and math.isfinite(value)


def int_problem(value: Any, minimum: int, maximum: int | None = None) -> str | None:
    """An integer (not a bool) in [minimum, maximum]."""
    if not is_int(value):
        return f"expected an integer, got {type(value).__name__} {value!r}"
    if value < minimum:
        return f"{value!r} is below the minimum {minimum}"
    if maximum is not None and value > maximum:
        return f"{value!r} is above the maximum {maximum}"
    return None


def frame_count_problem(value: Any, minimum: int) -> str | None:
    """Frame counts (`max_new_tokens`, `min_new_tokens`, profile `max_tokens`)."""
    return int_problem(value, minimum)


def fraction_problem(value: Any) -> str | None:
    """A number in (0, 1] (e.g. `gpu_memory_utilization`)."""
    if not is_real(value):
        return f"expected a number, got {type(value).__name__} {value!r}"
    return None if 0 < value <= 1 else f"{value!r} is outside (0, 1]"


def temperature_problem(value: Any) -> str | None:
    """Why `value` is not a valid temperature, or None when it is."""
    if not is_finite_number(value):
        return f"expected a finite number, got {type(value).__name__} {value!r}"
    if not 0.0 <= value <= TEMPERATURE_MAX:
        return f"{value!r} is outside [0, {TEMPERATURE_MAX:g}] (0 = greedy)"
    return None


def top_p_problem(value: Any) -> str | None:
    if not is_finite_number(value):
        return f"expected a finite number, got {type(value).__name__} {value!r}"
    if not 0.0 < value <= 1.0:
        return f"{value!r} is outside (0, 1] (1 = off)"
    return None


def top_k_problem(value: Any) -> str | None:
    return _range_note(int_problem(value, 0, TOP_K_MAX), value, f"[0, {TOP_K_MAX}] (0 = off, 1 = greedy)")


def seed_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not is_int(value):
        return f"expected an integer or null, got {type(value).__name__} {value!r}"
    return _range_note(int_problem(value, 0, SEED_MAX), value, "[0, 2**63 - 1]")


def _range_note(problem: str | None, value: Any, interval: str) -> str | None:
    """A type problem as is; a range problem phrased as "outside <interval>"."""
    if problem is None or not is_int(value):
        return problem
    return f"{value!r} is outside {interval}"
