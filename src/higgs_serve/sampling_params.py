"""Per-request sampling knobs (SPEC §1.7), frozen and validated at construction.

One `SamplingParams` applies to all 8 codebooks of a request: temperature → top-k → top-p →
multinomial. Temperature 0 or top_k 1 is greedy. `top_k = 0` means "off" (no top-k cut: all
1026 entries of a codebook stay candidates, before the delay-pattern masks). A `seed` makes the
draw reproducible and independent of batch position; `None` means the engine draws a random seed
per request (`with_seed`) before the request reaches the worker.

Lengths are counted in audio frames (one frame = 40 ms): `max_new_tokens` is the request's frame
cap, `min_new_tokens` the earliest frame at which codebook 0 may end the utterance.

The `*_problem` checkers are shared with `config/loader.py`, so a profile's
`default_sampling_params` obeys exactly the same limits as a request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from higgs_serve.errors import InvalidRequestError

if TYPE_CHECKING:  # config.deploy imports this module; the type is only for annotations
    from higgs_serve.config.deploy import DefaultSamplingParams

TEMPERATURE_MAX = 2.0
TOP_K_MAX = 1026  # per-codebook vocabulary: 1024 real codes + BOC + EOC
SEED_MAX = 2**63 - 1  # seeds feed a signed 64-bit counter-based RNG

DEFAULT_TEMPERATURE = 0.8  # SPEC §1.7: sglang-omni's SeedTTS-EN tuning (lowered WER)
DEFAULT_TOP_P = 0.8
DEFAULT_TOP_K = 30
DEFAULT_MAX_NEW_TOKENS = 2048  # frames: about 82 s of audio


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def temperature_problem(value: Any) -> str | None:
    """Why `value` is not a valid temperature, or None when it is."""
    if not _is_number(value):
        return f"expected a finite number, got {type(value).__name__} {value!r}"
    if not 0.0 <= value <= TEMPERATURE_MAX:
        return f"{value!r} is outside [0, {TEMPERATURE_MAX:g}] (0 = greedy)"
    return None


def top_p_problem(value: Any) -> str | None:
    if not _is_number(value):
        return f"expected a finite number, got {type(value).__name__} {value!r}"
    if not 0.0 < value <= 1.0:
        return f"{value!r} is outside (0, 1] (1 = off)"
    return None


def top_k_problem(value: Any) -> str | None:
    if not _is_int(value):
        return f"expected an integer, got {type(value).__name__} {value!r}"
    if not 0 <= value <= TOP_K_MAX:
        return f"{value!r} is outside [0, {TOP_K_MAX}] (0 = off, 1 = greedy)"
    return None


def seed_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not _is_int(value):
        return f"expected an integer or null, got {type(value).__name__} {value!r}"
    if not 0 <= value <= SEED_MAX:
        return f"{value!r} is outside [0, 2**63 - 1]"
    return None


def frame_count_problem(value: Any, minimum: int) -> str | None:
    """Frame counts (`max_new_tokens`, `min_new_tokens`, profile `max_tokens`)."""
    if not _is_int(value):
        return f"expected an integer, got {type(value).__name__} {value!r}"
    if value < minimum:
        return f"{value!r} is below the minimum {minimum}"
    return None


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    seed: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # frames
    min_new_tokens: int = 0  # frames

    def __post_init__(self) -> None:
        checks = (
            ("temperature", temperature_problem(self.temperature)),
            ("top_p", top_p_problem(self.top_p)),
            ("top_k", top_k_problem(self.top_k)),
            ("seed", seed_problem(self.seed)),
            ("max_new_tokens", frame_count_problem(self.max_new_tokens, 1)),
            ("min_new_tokens", frame_count_problem(self.min_new_tokens, 0)),
        )
        for name, problem in checks:
            if problem is not None:
                raise InvalidRequestError(f"{name}: {problem}", param=name)
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequestError(
                f"min_new_tokens: {self.min_new_tokens} is above max_new_tokens "
                f"{self.max_new_tokens}", param="min_new_tokens")
        # ints are accepted for the float knobs (`"temperature": 1`); store floats so the
        # sampler's tensors have one dtype.
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def with_seed(self, seed: int) -> SamplingParams:
        """A copy with `seed` set (the engine draws one for requests that gave none)."""
        return replace(self, seed=seed)

    @classmethod
    def from_defaults(
        cls,
        defaults: DefaultSamplingParams,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        min_new_tokens: int | None = None,
    ) -> SamplingParams:
        """Request fields over the profile's `default_sampling_params`; None = not given.

        The profile's `max_tokens` is a hard ceiling: a request asking for more frames is an
        error naming the limit, never silently clipped.
        """
        if max_new_tokens is not None:
            problem = frame_count_problem(max_new_tokens, 1)
            if problem is None and max_new_tokens > defaults.max_tokens:
                problem = (f"{max_new_tokens} is above this server's limit of "
                           f"{defaults.max_tokens} frames (deploy profile max_tokens)")
            if problem is not None:
                raise InvalidRequestError(f"max_new_tokens: {problem}", param="max_new_tokens")
        return cls(
            temperature=defaults.temperature if temperature is None else temperature,
            top_p=defaults.top_p if top_p is None else top_p,
            top_k=defaults.top_k if top_k is None else top_k,
            seed=defaults.seed if seed is None else seed,
            max_new_tokens=defaults.max_tokens if max_new_tokens is None else max_new_tokens,
            min_new_tokens=0 if min_new_tokens is None else min_new_tokens,
        )
