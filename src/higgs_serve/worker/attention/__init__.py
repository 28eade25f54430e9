"""Paged attention: metadata, the backend interface, the torch reference and the Triton GPU backend."""

from higgs_serve.worker.attention.backend import Attention, AttentionBackend, KVCache
from higgs_serve.worker.attention.metadata import AttentionMetadata, build_attention_metadata
from higgs_serve.worker.attention.selector import get_backend

__all__ = [
    "Attention",
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "build_attention_metadata",
    "get_backend",
]
