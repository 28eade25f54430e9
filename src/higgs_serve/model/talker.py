"""`Talker` (Stage 0): text embedding, fused audio embedding, Qwen3 backbone, tied audio head.

docs/model.md#talker. The audio input of a step is e(row) = Σ_q W_a[q·V + row_q] (V = 1026 per codebook);
it replaces the token embedding. The audio head is logits = h · W_aᵀ reshaped to [8, V] (W_a
itself when tied). There is no text LM head: every audio step's text token is `<|audio|>` by
construction, so a [D × 151936] matmul per step would be wasted.

Weights use internal names (see `talker_tensor_shapes`); `model/checkpoint.py` maps the
checkpoint names (`body.*`, `tied.*`) to them with a declarative rename table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from higgs_serve.errors import CheckpointError
from higgs_serve.model.hf_config import AudioConfig, TextConfig
from higgs_serve.model.qwen3 import Attention, MLPRunner, Qwen3Backbone

# per layer: internal name -> (fused parameter, slice index within the fused rows)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_PLAIN = {
    "input_norm": "input_norm.weight",
    "q_norm": "q_norm.weight",
    "k_norm": "k_norm.weight",
    "o_proj": "o_proj",
    "post_attention_norm": "post_attention_norm.weight",
    "down_proj": "down_proj",
}


def talker_tensor_shapes(text: TextConfig, audio: AudioConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the talker needs, by internal name, with its exact shape."""
    d, i = text.hidden_size, text.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "text_embedding.weight": (text.vocab_size, d),
        "norm.weight": (d,),
        "audio_embedding.weight": (audio.table_rows, d),
    }
    if not audio.tie_word_embeddings:
        shapes["audio_head.weight"] = (audio.table_rows, d)
    for n in range(text.num_layers):
        p = f"layers.{n}."
        shapes.update({
            p + "input_norm.weight": (d,),
            p + "q_proj.weight": (text.q_size, d),
            p + "k_proj.weight": (text.kv_size, d),
            p + "v_proj.weight": (text.kv_size, d),
            p + "o_proj.weight": (d, text.q_size),
            p + "q_norm.weight": (text.head_dim,),
            p + "k_norm.weight": (text.head_dim,),
            p + "post_attention_norm.weight": (d,),
            p + "gate_proj.weight": (i, d),
            p + "up_proj.weight": (i, d),
            p + "down_proj.weight": (d, i),
        })
    return shapes


class Talker(nn.Module):
    def __init__(self, text: TextConfig, audio: AudioConfig, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.text_cfg, self.audio_cfg = text, audio
        self.dtype = dtype
        d = text.hidden_size

        def weight(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)

        self.text_embedding = weight(text.vocab_size, d)
        self.audio_embedding = weight(audio.table_rows, d)  # W_a: [num_codebooks * V, D]
        self.audio_head = None if audio.tie_word_embeddings else weight(audio.table_rows, d)
        self.backbone = Qwen3Backbone(text, dtype=dtype, device=device)
        offsets = torch.arange(audio.num_codebooks, dtype=torch.int64, device=device) * audio.codebook_size
        self.register_buffer("audio_offsets", offsets, persistent=False)  # [8]: q * V

    # ---- embeddings ----
    def embed_text(self, token_ids: Tensor) -> Tensor:
        """token_ids [N] int64 -> [N, D]."""
        return F.embedding(token_ids, self.text_embedding)

    def embed_audio(self, rows: Tensor) -> Tensor:
        """rows [N, 8] int64 (delayed rows, BOC/EOC included) -> [N, D] = Σ_q W_a[q·V + row_q]."""
        return F.embedding(rows + self.audio_offsets, self.audio_embedding).sum(dim=1)

    # ---- backbone and head ----
    def forward(self, embeds: Tensor, positions: Tensor, attention: Attention,
                mlp: MLPRunner | None = None) -> Tensor:
        """embeds [N, D], positions [N] int64 -> final-normed hidden [N, D]. `mlp` optionally
        runs each layer's post-attention norm + MLP (see qwen3.MLPRunner)."""
        return self.backbone(embeds, positions, attention, mlp)

    def audio_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, D] -> logits [B, 8, V] float32."""
        head = self.audio_embedding if self.audio_head is None else self.audio_head
        logits = F.linear(hidden, head)  # [B, 8 * V] in the model dtype
        return logits.float().view(hidden.shape[0], self.audio_cfg.num_codebooks, self.audio_cfg.codebook_size)

    # ---- weights ----
    @torch.no_grad()
    def load_talker_weights(self, tensors: dict[str, Tensor]) -> None:
        """Copy tensors (internal names, see `talker_tensor_shapes`) into the parameters. Strict:
        a missing, misshaped or unknown name raises CheckpointError naming it."""
        check_talker_tensors(tensors, self.text_cfg, self.audio_cfg)
        self.text_embedding.copy_(tensors["text_embedding.weight"])
        self.audio_embedding.copy_(tensors["audio_embedding.weight"])
        if self.audio_head is not None:
            self.audio_head.copy_(tensors["audio_head.weight"])
        self.backbone.norm.weight.copy_(tensors["norm.weight"])
        for n, layer in enumerate(self.backbone.layers):
            p = f"layers.{n}."
            for name, target in _PLAIN.items():
                _resolve(layer, target).copy_(tensors[f"{p}{name}.weight"])
            qkv_rows = (layer.q_size, layer.kv_size, layer.kv_size)
            gate_up_rows = (layer.intermediate_size, layer.intermediate_size)
            qkv = layer.qkv_proj.split(qkv_rows, dim=0)
            gate_up = layer.gate_up_proj.split(gate_up_rows, dim=0)
            for name, (fused, idx) in _FUSED.items():
                (qkv if fused == "qkv_proj" else gate_up)[idx].copy_(tensors[f"{p}{name}.weight"])


def check_talker_tensors(tensors: dict[str, Tensor], text: TextConfig, audio: AudioConfig) -> None:
    """Strict name and shape check; the error names every offending tensor (sorted)."""
    expected = talker_tensor_shapes(text, audio)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"talker tensor(s) missing from the checkpoint: {', '.join(missing[:8])}"
                              + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""))
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise CheckpointError(f"unexpected talker tensor(s): {', '.join(unknown[:8])}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"talker tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")


def _resolve(module: nn.Module, dotted: str) -> Tensor:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module  # type: ignore[return-value]
