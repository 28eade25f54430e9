"""The transformers reference codec for parity tests (tests only; the product never imports this).

transformers' `HiggsAudioV2TokenizerModel` imports torchaudio at module import. Real torchaudio is
used when it loads; otherwise `tests/support/torchaudio` (a stand-in with only
`functional.resample`) is put on sys.path first.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

SUPPORT_DIR = Path(__file__).resolve().parent
STAND_IN_MARK = "higgs-serve-test-stand-in"


def _ensure_torchaudio() -> None:
    if "torchaudio" in sys.modules:
        return
    if importlib.util.find_spec("torchaudio") is not None:
        try:
            import torchaudio  # noqa: F401
            return
        except (ImportError, OSError):  # a wheel whose compiled library does not load beside this torch
            for name in [m for m in sys.modules if m == "torchaudio" or m.startswith("torchaudio.")]:
                del sys.modules[name]
    if str(SUPPORT_DIR) not in sys.path:
        sys.path.insert(0, str(SUPPORT_DIR))
    import torchaudio  # noqa: F401  (the stand-in)


def torchaudio_is_real() -> bool:
    """True when the loaded torchaudio is the real library, not the test stand-in."""
    _ensure_torchaudio()
    import torchaudio

    return STAND_IN_MARK not in getattr(torchaudio, "__version__", "")


def import_higgs_tokenizer_model():
    """Return (HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel) from transformers."""
    _ensure_torchaudio()
    from transformers import HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel

    return HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel


def build_reference(hf_dict: dict, device: str | torch.device = "cpu"):
    """A transformers codec in eval mode built from a `CodecConfig.to_hf_dict()` dict."""
    config_cls, model_cls = import_higgs_tokenizer_model()
    with torch.device(device):
        model = model_cls(config_cls(**hf_dict))
    return model.eval()


def fold_parametrizations_(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every weight-norm parametrization in place, so state_dict() has plain `.weight`s."""
    from torch.nn.utils import parametrize

    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return model


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter and codebook a random, well-scaled value (transformers inits codebooks
    and biases to zero, which would hide bugs). Snake alphas stay positive, norms near 1."""
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=g)

    for name, p in model.named_parameters():
        if name.endswith("alpha"):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        elif "norm" in name.split(".")[-2] and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * randn(p.shape))
        elif name.endswith("original0"):  # weight-norm magnitude g
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        elif p.ndim == 1:
            p.copy_(0.1 * randn(p.shape))
        else:
            fan_in = p[0].numel() if not name.endswith("conv_t1.weight") else p.shape[0] * p.shape[2] // 2
            gain = 0.3 if "res_unit" in name else 1.0  # keep residual stacks from growing the signal
            p.copy_(gain * randn(p.shape) / max(fan_in, 1) ** 0.5)
    for name, b in model.named_buffers():
        if name.endswith("codebook.embed"):
            b.copy_(randn(b.shape))
    return model


def reference_codec_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's folded state_dict: the prefix-stripped codec tensors a checkpoint would carry."""
    fold_parametrizations_(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
