"""Per-request sampling knobs (docs/model.md#sampling), frozen and validated at construction.

One `SamplingParams` applies to all 8 codebooks of a request: temperature → top-k → top-p →
multinomial. Temperature 0 or top_k 1 is greedy. `top_k = 0` means "off" (no top-k cut: all
1026 entries of a codebook stay candidates, before the delay-pattern masks). A `seed` makes the
draw reproducible and independent of batch position; `None` means the engine draws a random seed
per request (`with_seed`) before the request reaches the worker.

Lengths are counted in audio frames (one frame = 40 ms): `max_new_tokens` is the request's frame
cap, `min_new_tokens` the earliest frame at which codebook 0 may end the utterance.

The `*_problem` checkers live in `config/validators.py`, shared with the deploy loader, so a
profile's `default_sampling_params` obeys exactly the same limits as a request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from higgs_serve.config.sampling_defaults import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    DefaultSamplingParams,
)
from higgs_serve.config.validators import (
    frame_count_problem,
    seed_problem,
    temperature_problem,
    top_k_problem,
    top_p_problem,
)
from higgs_serve.errors import InvalidRequestError


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
