"""Pre-encoded references: codec codes [T, 8] (as `higgs-serve encode-voice` saves them) checked
once, so a client that encoded a voice never sends its audio again (the API's `reference_codes`,
`synth --ref-codes`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from higgs_serve.engine.speech import ReferenceAudio
from higgs_serve.errors import HiggsServeError, InvalidRequestError
from higgs_serve.voices.reference_encoder import reference_audio
from higgs_serve.voices.registry import MAX_REFERENCE_SECONDS

FRAMES_PER_SECOND = 25
MAX_REFERENCE_FRAMES = int(MAX_REFERENCE_SECONDS * FRAMES_PER_SECOND)  # 750: the clip limit
NUM_CODEBOOKS = 8
CODE_VALUES = 1024  # real codes per codebook (1024 and 1025 are the delay pattern's BOC/EOC)


def check_reference_codes(codes: np.ndarray, param: str) -> np.ndarray:
    """codes -> [T, 8] int64 if T is 1..750 and every code is 0-1023; else InvalidRequestError."""
    if codes.ndim != 2 or codes.shape[1] != NUM_CODEBOOKS:
        raise InvalidRequestError(
            f"{param} must have shape [T, {NUM_CODEBOOKS}], got {list(codes.shape)}", param=param)
    if not 1 <= codes.shape[0] <= MAX_REFERENCE_FRAMES:
        raise InvalidRequestError(
            f"{param} must hold 1-{MAX_REFERENCE_FRAMES} frames ({MAX_REFERENCE_SECONDS:g} s at "
            f"{FRAMES_PER_SECOND} frames per second), got {codes.shape[0]}", param=param)
    if not np.issubdtype(codes.dtype, np.integer):
        raise InvalidRequestError(f"{param} must hold integers, got {codes.dtype}", param=param)
    low, high = int(codes.min()), int(codes.max())
    if low < 0 or high >= CODE_VALUES:
        raise InvalidRequestError(
            f"{param} codes must be 0-{CODE_VALUES - 1}, got values {low}..{high}", param=param)
    return codes.astype(np.int64)


def reference_from_codes_file(path: str, ref_text: str | None) -> ReferenceAudio:
    """A .npy of codes [T, 8] -> the engine's reference; HiggsServeError naming the file."""
    file = Path(path)
    if not file.is_file():
        raise HiggsServeError(f"reference codes file {path} does not exist")
    try:
        codes = np.load(file, allow_pickle=False)
        return reference_audio(check_reference_codes(codes, str(file)), ref_text)
    except (ValueError, OSError, InvalidRequestError) as error:
        raise HiggsServeError(f"reference codes file {path}: {error}") from error
