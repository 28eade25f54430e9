"""Paged attention: metadata, the backend interface, the torch reference and the Triton GPU backend."""

from higgs_serve.worker.attention.backend import Attention, AttentionBackend, KVCache, get_backend
from higgs_serve.worker.attention.metadata import AttentionMetadata, build_attention_metadata

__all__ = [
    "Attention",
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "build_attention_metadata",
    "get_backend",
]
