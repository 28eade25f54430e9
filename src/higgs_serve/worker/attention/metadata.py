"""Per-step attention metadata: where each request's query tokens, context and pages are.

A plain dataclass of device tensors plus host ints, so the model runner can fill it from
preallocated buffers (the tensors keep their addresses across CUDA-graph replays; only their
contents change). Conventions:

- request b's query tokens are rows `query_start_loc[b] : query_start_loc[b+1]` of q/k/v;
- its context after this step is `seq_lens[b]` tokens, so its first query token sits at
  position `seq_lens[b] − q_len_b` and each query token sees context [0, its position];
- token t of request b lives in page `block_tables[b, t // block_size]`, offset
  `t % block_size`;
- `slot_mapping[i]` is the cache slot written by new token i; the backends skip a negative
  slot ("padding, write nothing") and give a request with `seq_lens = 0` zero output. (The
  model runner pads its CUDA-graph decode batches differently: each padded request has one
  dummy token that writes to and reads only a scratch block past the scheduler's pool, with
  `seq_lens = 1`; see `ModelRunner._fill_decode_padding`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass
class AttentionMetadata:
    query_start_loc: Tensor  # [B+1] int32, cumulative query lengths of this step's requests
    seq_lens: Tensor  # [B] int32, context length after this step's tokens are written
    block_tables: Tensor  # [B, max_blocks] int32 (padding entries = 0)
    slot_mapping: Tensor  # [N] int64, cache slot (block_id * block_size + offset) of each new token
    max_query_len: int
    max_seq_len: int
    # The first num_decodes requests have one query token each, in rows 0..num_decodes-1 (the
    # runner stages decodes first): a backend may give them its decode kernel in a mixed step.
    num_decodes: int = 0

    @property
    def num_requests(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    def leading(self, n: int) -> AttentionMetadata:
        """The metadata of the first n requests alone (views that start where these do)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: n + 1],
            seq_lens=self.seq_lens[:n],
            block_tables=self.block_tables[:n],
            slot_mapping=self.slot_mapping,
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
        )

    @property
    def is_pure_decode(self) -> bool:
        """Every request has exactly one query token (row b of q belongs to request b)."""
        return self.max_query_len == 1 and self.num_tokens == self.num_requests


def build_attention_metadata(
    start_positions: Sequence[int],
    query_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    max_blocks: int | None = None,
) -> AttentionMetadata:
    """Metadata from host lists (tests, benchmarks, eager paths); one entry per request."""
    if not (len(start_positions) == len(query_lens) == len(block_tables)):
        raise ValueError(
            "start_positions, query_lens and block_tables must have one entry per request, got "
            f"{len(start_positions)}, {len(query_lens)}, {len(block_tables)}"
        )
    seq_lens = [s + q for s, q in zip(start_positions, query_lens)]
    width = max_blocks if max_blocks is not None else max((len(t) for t in block_tables), default=0)
    slots: list[int] = []
    for b, (start, q_len, table) in enumerate(zip(start_positions, query_lens, block_tables)):
        if len(table) * block_size < seq_lens[b]:
            raise ValueError(
                f"block_tables[{b}] has {len(table)} pages of {block_size}, too few for "
                f"{seq_lens[b]} tokens"
            )
        slots.extend(table[t // block_size] * block_size + t % block_size for t in range(start, start + q_len))
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    cumulative = [0]
    for q_len in query_lens:
        cumulative.append(cumulative[-1] + q_len)
    return AttentionMetadata(
        query_start_loc=torch.tensor(cumulative, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )
