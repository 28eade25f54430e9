"""Preallocated per-step input buffers: one pinned host staging area, one device copy per step.

Every field has a fixed offset sized for the worst case (`max_tokens` tokens, `max_seqs` requests),
so the device views never move: CUDA graphs captured on them stay valid, and a step costs one
host→device copy of the int64 area plus one of the block-table rows in use.

The host side is double-buffered (`flip`): with one-step lookahead the next step is staged while
the previous step's asynchronous copy may still be reading the other host buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Per-token int64 fields, then per-request fields, in this order inside the packed buffer.
_TOKEN_FIELDS = ("token_ids", "positions", "audio_src_slot", "slot_mapping", "ref_row_index")
_SEQ_FIELDS = ("sample_token_index", "sample_slots")


@dataclass
class StepInputs:
    """Device views for one step (sliced to the step's sizes)."""

    num_tokens: int
    num_seqs: int
    num_samples: int
    token_ids: torch.Tensor  # [N] int64: prompt token ids (0 where the input is an audio row)
    positions: torch.Tensor  # [N] int64
    audio_src_slot: torch.Tensor  # [N] int64: slot whose last row is this token's input, or -1
    slot_mapping: torch.Tensor  # [N] int64: KV cache slot of each new token
    ref_row_index: torch.Tensor  # [N] int64: row of the step's reference-rows table, or -1
    sample_token_index: torch.Tensor  # [S] int64: token whose hidden state samples a row
    sample_slots: torch.Tensor  # [S] int64: audio-state slot of each sampled row
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    has_audio_inputs: bool
    has_text_inputs: bool


class InputBuffers:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device: torch.device):
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.max_blocks = max_blocks_per_seq
        size64 = len(_TOKEN_FIELDS) * max_tokens + len(_SEQ_FIELDS) * max_seqs
        pin = device.type == "cuda"
        self._hosts64 = [torch.zeros(size64, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._dev64 = torch.zeros(size64, dtype=torch.int64, device=device)
        # int32 area: query_start_loc [max_seqs+1], seq_lens [max_seqs], block tables [max_seqs, max_blocks]
        size32 = (max_seqs + 1) + max_seqs + max_seqs * max_blocks_per_seq
        self._hosts32 = [torch.zeros(size32, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._dev32 = torch.zeros(size32, dtype=torch.int32, device=device)
        self._current = 0
        self._host64, self._host32 = self._hosts64[0], self._hosts32[0]
        self.np64, self.np32 = self._host64.numpy(), self._host32.numpy()
        self._offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for name in _TOKEN_FIELDS:
            self._offsets[name] = (off, max_tokens)
            off += max_tokens
        for name in _SEQ_FIELDS:
            self._offsets[name] = (off, max_seqs)
            off += max_seqs
        self._qsl_off = 0
        self._seq_lens_off = max_seqs + 1
        self._bt_off = 2 * max_seqs + 1

    @property
    def current(self) -> int:
        """Which of the two host buffers the step being staged uses (0 or 1)."""
        return self._current

    def flip(self) -> None:
        """Stage the next step into the other host buffer."""
        self._current ^= 1
        self._host64, self._host32 = self._hosts64[self._current], self._hosts32[self._current]
        self.np64, self.np32 = self._host64.numpy(), self._host32.numpy()

    def host(self, name: str) -> np.ndarray:
        off, cap = self._offsets[name]
        return self.np64[off : off + cap]

    def host_query_start_loc(self) -> np.ndarray:
        return self.np32[self._qsl_off : self._qsl_off + self.max_seqs + 1]

    def host_seq_lens(self) -> np.ndarray:
        return self.np32[self._seq_lens_off : self._seq_lens_off + self.max_seqs]

    def host_block_tables(self) -> np.ndarray:
        n = self.max_seqs * self.max_blocks
        return self.np32[self._bt_off : self._bt_off + n].reshape(self.max_seqs, self.max_blocks)

    def dev(self, name: str, n: int) -> torch.Tensor:
        off, _ = self._offsets[name]
        return self._dev64[off : off + n]

    def upload(self, num_seqs: int) -> None:
        """Copy the staged host values to the device (two copies, non-blocking on CUDA)."""
        self._dev64.copy_(self._host64, non_blocking=True)
        end32 = self._bt_off + num_seqs * self.max_blocks
        self._dev32[:end32].copy_(self._host32[:end32], non_blocking=True)

    def device_tensors(self) -> list[torch.Tensor]:
        """The device areas every step's views point into (they never move)."""
        return [self._dev64, self._dev32]

    def views(
        self, num_tokens: int, num_seqs: int, num_samples: int, has_audio: bool, has_text: bool
    ) -> StepInputs:
        bt = self._dev32[self._bt_off : self._bt_off + self.max_seqs * self.max_blocks]
        return StepInputs(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            num_samples=num_samples,
            token_ids=self.dev("token_ids", num_tokens),
            positions=self.dev("positions", num_tokens),
            audio_src_slot=self.dev("audio_src_slot", num_tokens),
            slot_mapping=self.dev("slot_mapping", num_tokens),
            ref_row_index=self.dev("ref_row_index", num_tokens),
            sample_token_index=self.dev("sample_token_index", num_samples),
            sample_slots=self.dev("sample_slots", num_samples),
            query_start_loc=self._dev32[self._qsl_off : self._qsl_off + num_seqs + 1],
            seq_lens=self._dev32[self._seq_lens_off : self._seq_lens_off + num_seqs],
            block_tables=bt.view(self.max_seqs, self.max_blocks)[:num_seqs],
            has_audio_inputs=has_audio,
            has_text_inputs=has_text,
        )
