"""Paged KV block pool, per-request block tables and the prefix cache. Ints only.

The worker sizes the pool (from `gpu_memory_utilization`, or an explicit block count on CPU);
this class takes `num_blocks` and `block_size` and hands out block ids.

- Block 0 is never handed out: runners may point padding slots (CUDA graph padding, unused
  block-table entries) at it without corrupting a live request.
- Reservation: at admission a request reserves the blocks of its worst-case context; blocks are
  then taken from the pool lazily as the context grows, but reserved blocks are never counted as
  free, so a running request can always grow to its worst case. Free blocks that hold cached
  prefix content stay reusable until they are actually needed.
- Prefix caching: each full prompt block is keyed by its CONTENT,
  key = blake2b(parent key, token ids of the block, extra key), where the extra key of a block
  overlapping the clone placeholder span is the request's `placeholder_key` (a content hash of
  the reference codes), so placeholder positions of different voices never collide. A block
  overlapping a placeholder span without a key is not cacheable, nor is anything after it.
  Only prompt blocks are keyed: generated audio rows depend on sampling and are never shared.
- Eviction: free blocks without content are used first; then the least recently freed cached
  block is evicted (its key is dropped, so it can never be returned as a stale hit). Blocks with
  a reference count above zero are never in the free pools, so they are never evicted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from higgs_serve.engine.request import Request

NULL_BLOCK = 0  # never allocated: a safe target for padding
_ROOT_KEY = bytes(16)  # parent key of a prompt's first block


def compute_block_keys(
    prompt_token_ids: tuple[int, ...],
    block_size: int,
    placeholder_key: str | None = None,
    placeholder_start: int = 0,
    num_placeholders: int = 0,
) -> tuple[bytes, ...]:
    """Content keys of the full prompt blocks, chained from the first block (16 bytes each)."""
    keys: list[bytes] = []
    parent = _ROOT_KEY
    placeholder_end = placeholder_start + num_placeholders
    for start in range(0, len(prompt_token_ids) - block_size + 1, block_size):
        end = start + block_size
        extra = b""
        if num_placeholders > 0 and start < placeholder_end and end > placeholder_start:
            if placeholder_key is None:
                break  # content of the P positions unknown: this block and its children uncacheable
            extra = placeholder_key.encode()
        digest = hashlib.blake2b(parent, digest_size=16)
        # parent (16 bytes) and tokens (block_size * 8 bytes) have fixed lengths, so appending the
        # variable-length extra key keeps the encoding unambiguous.
        digest.update(array("q", prompt_token_ids[start:end]).tobytes())
        digest.update(extra)
        parent = digest.digest()
        keys.append(parent)
    return tuple(keys)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
            )
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._key_of_block: list[bytes | None] = [None] * num_blocks
        self._block_of_key: dict[bytes, int] = {}
        # Free blocks without content (a stack, lowest id on top), and free blocks that hold
        # cached prefix content (least recently freed first).
        self._free_plain: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._tables: dict[str, list[int]] = {}
        self._table_tuples: dict[str, tuple[int, ...]] = {}
        self._num_keyed: dict[str, int] = {}  # leading table blocks already in the prefix cache
        self._reserved: dict[str, int] = {}  # blocks promised to a request, not yet taken
        self._num_reserved = 0
        # Counters (tokens, like vLLM: queries = prompt tokens looked up, hits = tokens reused).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_evictions = 0

    # ----- capacity
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new admission may take: free (cached or not) minus those already promised."""
        return len(self._free_plain) + len(self._free_cached) - self._num_reserved

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    # ----- prefix cache lookups
    def block_keys(self, request: Request) -> tuple[bytes, ...]:
        if not self.enable_prefix_caching:
            return ()
        return compute_block_keys(
            request.prompt_token_ids,
            self.block_size,
            request.placeholder_key,
            request.placeholder_start,
            request.num_placeholders,
        )

    def get_computed_blocks(self, request: Request) -> tuple[tuple[int, ...], int]:
        """The longest cached prefix: (block ids, tokens). Pure: changes no state.

        At least the prompt's last token is always left to compute: its hidden state gives row 0.
        """
        if not self.enable_prefix_caching:
            return (), 0
        max_hit_blocks = (request.num_prompt_tokens - 1) // self.block_size
        hits: list[int] = []
        for key in request.block_keys[:max_hit_blocks]:
            block = self._block_of_key.get(key)
            if block is None:
                break
            hits.append(block)
        return tuple(hits), len(hits) * self.block_size

    # ----- allocation (check/act: None means "does not fit", nothing changed)
    def allocate(
        self,
        request: Request,
        computed_blocks: tuple[int, ...],
        num_tokens: int,
        num_reserved_tokens: int,
    ) -> tuple[int, ...] | None:
        """Admit a request: share `computed_blocks`, reserve blocks for `num_reserved_tokens`,
        and take blocks covering the first `num_tokens`. Returns the block table, or None."""
        request_id = request.request_id
        if request_id in self._tables:
            raise RuntimeError(f"request {request_id} already holds KV blocks")
        num_total = max(self.num_blocks_for(num_reserved_tokens), len(computed_blocks))
        num_free_hits = sum(1 for block in computed_blocks if self._ref_counts[block] == 0)
        if num_free_hits + num_total - len(computed_blocks) > self.num_free_blocks:
            return None
        for block in computed_blocks:
            self._touch(block)
        self._tables[request_id] = list(computed_blocks)
        self._table_tuples[request_id] = computed_blocks
        self._num_keyed[request_id] = len(computed_blocks)
        self._reserved[request_id] = num_total - len(computed_blocks)
        self._num_reserved += num_total - len(computed_blocks)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += request.num_prompt_tokens
            self.prefix_cache_hits += len(computed_blocks) * self.block_size
        table = self.allocate_slots(request_id, num_tokens)
        assert table is not None, "a reserved allocation cannot fail"
        return table

    def allocate_slots(self, request_id: str, num_tokens: int) -> tuple[int, ...] | None:
        """Grow a request's table to cover `num_tokens` positions, from its reservation first."""
        table_tuple = self._table_tuples[request_id]
        if num_tokens <= len(table_tuple) * self.block_size:
            return table_tuple  # the common decode case: no new block
        table = self._tables[request_id]
        num_new = self.num_blocks_for(num_tokens) - len(table)
        from_reserve = min(num_new, self._reserved[request_id])
        if num_new - from_reserve > self.num_free_blocks:
            return None
        self._reserved[request_id] -= from_reserve
        self._num_reserved -= from_reserve
        for _ in range(num_new):
            table.append(self._take_free_block())
        table_tuple = tuple(table)
        self._table_tuples[request_id] = table_tuple
        return table_tuple

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return self._table_tuples[request_id]

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publish the request's prompt blocks that are fully computed as prefix-cache entries."""
        if not self.enable_prefix_caching:
            return
        request_id = request.request_id
        table = self._tables[request_id]
        start = self._num_keyed[request_id]
        end = min(num_computed_tokens // self.block_size, len(request.block_keys), len(table))
        for i in range(start, end):
            key = request.block_keys[i]
            if key in self._block_of_key:
                continue  # the same content was computed concurrently elsewhere; keep the first
            self._block_of_key[key] = table[i]
            self._key_of_block[table[i]] = key
        self._num_keyed[request_id] = max(start, end)

    def free(self, request_id: str) -> None:
        """Release a request's blocks and its remaining reservation."""
        table = self._tables.pop(request_id)
        del self._table_tuples[request_id]
        del self._num_keyed[request_id]
        self._num_reserved -= self._reserved.pop(request_id)
        # Tail blocks first, so a chain's deepest blocks are evicted before its root.
        for block in reversed(table):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] > 0:
                continue
            if self._key_of_block[block] is None:
                self._free_plain.append(block)
            else:
                self._free_cached[block] = None

    # ----- internals
    def _touch(self, block: int) -> None:
        if self._ref_counts[block] == 0:
            del self._free_cached[block]  # a keyed block at ref 0 is always in the cached pool
        self._ref_counts[block] += 1

    def _take_free_block(self) -> int:
        if self._free_plain:
            block = self._free_plain.pop()
        else:
            block, _ = self._free_cached.popitem(last=False)
            del self._block_of_key[self._key_of_block[block]]
            self._key_of_block[block] = None
            self.num_evictions += 1
        self._ref_counts[block] = 1
        return block
