"""Test-only stand-in for torchaudio (the real wheel does not load beside the CPU torch here).

transformers' `HiggsAudioV2TokenizerModel` imports torchaudio at module import and uses only
`torchaudio.functional.resample` inside `encode`. This package provides just that function. It is
put on sys.path by `tests/support/hf_reference.py`; the product never imports torchaudio.
"""

__version__ = "0.0.0+higgs-serve-test-stand-in"

from . import functional  # noqa: E402,F401
