"""`get_backend`: the attention backend by name.

Its own module, not the base-class file: the backends import the base class (`backend.py`), and
the selector imports the backends, so with the selector in `backend.py` the package imported
itself in a circle.
"""

from __future__ import annotations

from higgs_serve.worker.attention.backend import AttentionBackend


def get_backend(name: str) -> AttentionBackend:
    """"torch" (reference, any device) or "triton" (CUDA only)."""
    if name == "torch":
        from higgs_serve.worker.attention.torch_ref import TorchPagedAttention

        return TorchPagedAttention()
    if name == "triton":
        from higgs_serve.worker.attention.triton_backend import TritonPagedAttention

        return TritonPagedAttention()
    raise ValueError(f"unknown attention backend {name!r}; expected 'torch' or 'triton'")
