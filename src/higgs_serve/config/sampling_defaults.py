"""The sampling defaults a deploy profile carries (`default_sampling_params`), written once.

`SamplingParams` (a request's knobs, `higgs_serve/sampling_params.py`) and the deploy profile
(`config.deploy.TalkerStageConfig`) both start from here; this module imports neither, so the
two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TEMPERATURE = 0.8  # docs/model.md, Sampling: tuned for a lower word error rate
DEFAULT_TOP_P = 0.8
DEFAULT_TOP_K = 30
DEFAULT_MAX_NEW_TOKENS = 2048  # frames: about 82 s of audio


@dataclass(frozen=True)
class DefaultSamplingParams:
    """Profile defaults a request's own fields override (SamplingParams.from_defaults).

    `seed: null` means a random seed per request. A fixed profile seed would make every request
    without its own seed produce identical audio for the same text (vllm-omni ships one; we don't).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_NEW_TOKENS  # frames; also the ceiling for max_new_tokens
    seed: int | None = None
