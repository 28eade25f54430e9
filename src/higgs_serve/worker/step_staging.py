"""Host side of a Stage 0 step: a `StepPlan`'s chunks written into the pinned staging buffers.

Per request slot it keeps what the prompt needs on the host (token ids, a clone's reference
rows). `stage` packs a plan's chunks, plain decodes first (row b is request b's only token for
every b below the number of decodes, which the attention backend relies on in mixed steps, and
those are most of every step, so they are written in a few vectorized stores); the padding
helpers fill the rows a CUDA graph replays beyond the real ones. No device work here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from higgs_serve.worker.step_contract import NewRequestData, StepPlan
from higgs_serve.worker.input_buffers import InputBuffers


@dataclass
class SlotPrompt:
    """Host copy of what a slot's prompt needs: token ids and, for clones, the reference rows."""

    token_ids: np.ndarray  # [P] int64
    ref_rows: np.ndarray | None  # [R, 8] int64 delayed reference rows for the placeholder span
    ref_start: int


@dataclass
class Staged:
    """What staging found out about a step (the device side needs it to pick a path)."""

    num_tokens: int
    has_audio: bool
    has_text: bool
    ref_parts: list[np.ndarray]
    sample_ids: list[str]
    num_decodes: int  # leading single-token requests


class StepStager:
    def __init__(self, buffers: InputBuffers, block_size: int, num_codebooks: int, pad_slot: int,
                 scratch_block: int):
        self.buffers = buffers
        self.block_size = block_size
        self.num_codebooks = num_codebooks
        self.pad_slot = pad_slot  # the always-done audio-state slot padded rows sample into
        self.scratch_block = scratch_block  # the KV block padded decode rows write and read
        self.prompts: dict[int, SlotPrompt] = {}
        # Each slot's block table as last staged, and its length. A running request's table only
        # grows (blocks are appended, never replaced: no preemption), so a decode writes the new
        # entries of its slot's row and the step gathers its rows in one store: at hundreds of
        # decodes a step, writing every row from its tuple was most of the staging time.
        self._tables = np.zeros((buffers.max_seqs, buffers.max_blocks), dtype=np.int32)
        self._table_lens = [0] * buffers.max_seqs

    def add(self, new: NewRequestData) -> None:
        self._tables[new.slot] = 0
        self._table_lens[new.slot] = 0
        ref_rows = None
        if new.placeholder_rows is not None:
            ref_rows = np.asarray(new.placeholder_rows, dtype=np.int64).reshape(-1, self.num_codebooks)
        self.prompts[new.slot] = SlotPrompt(
            token_ids=np.asarray(new.prompt_token_ids, dtype=np.int64),
            ref_rows=ref_rows,
            ref_start=new.placeholder_start,
        )

    def release(self, slot: int) -> None:
        self.prompts.pop(slot, None)

    def stage(self, plan: StepPlan) -> Staged:
        """Fill the host staging buffers for the plan's chunks (no device work)."""
        buf = self.buffers
        chunks, plain = self._ordered(plan.chunks)
        num_decodes = sum(1 for c in chunks if c.num_tokens == 1)
        buf.host_query_start_loc()[0] = 0
        sample_ids = [c.request_id for c in chunks[:plain]]
        self._stage_decodes(chunks[:plain])
        staged = Staged(plain, plain > 0, False, [], sample_ids, num_decodes)
        for i in range(plain, len(chunks)):
            self._stage_chunk(i, chunks[i], staged)
        return staged

    def _ordered(self, chunks: tuple) -> tuple[list, int]:
        """The chunks in staging order and how many plain decodes lead it (one token past the
        prompt, sampling). Single-token chunks come first, plain decodes leading: then row b is
        request b's only token for every b below the number of decodes (a mixed step runs the
        decode attention kernel on those), and the decodes, most of every step, are staged in a
        few vectorized writes. The scheduler already puts its decodes first, so only the chunks
        after them are sorted, unless a plain decode turns up among those."""
        prompts = self.prompts

        def key(c) -> tuple[bool, bool]:  # (False, False): one token past the prompt
            return c.num_tokens != 1, c.start_pos < len(prompts[c.slot].token_ids)

        def plain_decode(c) -> bool:
            return c.samples and key(c) == (False, False)

        def leading_plain(seq) -> int:
            return sum(1 for _ in itertools.takewhile(plain_decode, seq))

        plain = leading_plain(chunks)
        rest = sorted(chunks[plain:], key=key)
        if rest and key(rest[0]) == (False, False):  # decodes out of order: sort them all
            ordered = sorted(chunks, key=key)
            return ordered, leading_plain(ordered)
        return [*chunks[:plain], *rest], plain

    def _stage_decodes(self, chunks: list) -> None:
        """Rows 0..len-1: one decode token per chunk, each sampling a row."""
        if not chunks:
            return
        buf = self.buffers
        d = len(chunks)
        block_size = self.block_size
        tables, lens = self._tables, self._table_lens
        for chunk in chunks:
            slot, ids = chunk.slot, chunk.block_ids
            have, n = lens[slot], len(ids)
            if n > have:
                tables[slot, have:n] = ids[have:]
            elif n < have:  # not a growth (cannot happen under the KV manager): the whole row
                tables[slot] = 0
                tables[slot, :n] = ids
            lens[slot] = n
        starts = np.array([c.start_pos for c in chunks], dtype=np.int64)
        slots = np.array([c.slot for c in chunks], dtype=np.int64)
        pages = tables[slots, starts // block_size].astype(np.int64)
        rows = np.arange(d, dtype=np.int64)
        buf.host("positions")[:d] = starts
        buf.host("token_ids")[:d] = 0
        buf.host("audio_src_slot")[:d] = slots  # the input is the slot's previous delayed row
        buf.host("ref_row_index")[:d] = -1
        buf.host("slot_mapping")[:d] = pages * block_size + starts % block_size
        buf.host("sample_token_index")[:d] = rows
        buf.host("sample_slots")[:d] = slots
        buf.host_seq_lens()[:d] = starts + 1
        buf.host_query_start_loc()[1 : d + 1] = rows + 1
        buf.host_block_tables()[:d] = tables[slots]

    def _stage_chunk(self, i: int, chunk, staged: Staged) -> None:
        """Request row i: a prompt chunk (or a lone decode that does not sample), tokens from
        row staged.num_tokens on; updates `staged` in place."""
        buf = self.buffers
        prompt = self.prompts[chunk.slot]
        n = staged.num_tokens
        start, count = chunk.start_pos, chunk.num_tokens
        end = start + count
        positions = np.arange(start, end, dtype=np.int64)
        buf.host("positions")[n : n + count] = positions
        refi = buf.host("ref_row_index")
        refi[n : n + count] = -1
        if start >= len(prompt.token_ids):
            buf.host("token_ids")[n : n + count] = 0
            buf.host("audio_src_slot")[n : n + count] = chunk.slot
            staged.has_audio = True
        else:
            buf.host("token_ids")[n : n + count] = prompt.token_ids[start:end]
            buf.host("audio_src_slot")[n : n + count] = -1
            staged.has_text = True
            if prompt.ref_rows is not None:
                lo = max(start, prompt.ref_start)
                hi = min(end, prompt.ref_start + len(prompt.ref_rows))
                if lo < hi:
                    num_ref = sum(len(part) for part in staged.ref_parts)
                    refi[n + lo - start : n + hi - start] = np.arange(num_ref, num_ref + hi - lo)
                    staged.ref_parts.append(prompt.ref_rows[lo - prompt.ref_start : hi - prompt.ref_start])
                    staged.has_audio = True
        block_size = self.block_size
        blocks = np.asarray(chunk.block_ids, dtype=np.int64)
        buf.host("slot_mapping")[n : n + count] = blocks[positions // block_size] * block_size + positions % block_size
        bt = buf.host_block_tables()
        bt[i, : len(blocks)] = blocks
        bt[i, len(blocks) :] = 0
        buf.host_seq_lens()[i] = end
        staged.num_tokens = n + count
        buf.host_query_start_loc()[i + 1] = n + count
        if chunk.samples:
            s = len(staged.sample_ids)
            buf.host("sample_token_index")[s] = n + count - 1
            buf.host("sample_slots")[s] = chunk.slot
            staged.sample_ids.append(chunk.request_id)

    def fill_token_padding(self, num_tokens: int, padded: int, num_samples: int, padded_samples: int) -> None:
        """Token rows [num_tokens, padded) belong to no request and write no K/V; sampled rows
        [num_samples, padded_samples) read token 0 and step the always-done pad slot."""
        buf = self.buffers
        pad = slice(num_tokens, padded)
        buf.host("token_ids")[pad] = 0
        buf.host("positions")[pad] = 0
        buf.host("audio_src_slot")[pad] = -1
        buf.host("slot_mapping")[pad] = -1
        buf.host("ref_row_index")[pad] = -1
        buf.host("sample_token_index")[num_samples:padded_samples] = 0
        self.fill_sample_padding(num_samples, padded_samples)

    def fill_sample_padding(self, num_samples: int, padded_samples: int) -> None:
        """Sampled rows [num_samples, padded_samples) step the always-done pad slot (a sampling
        graph of padded_samples rows replayed for an eagerly run step)."""
        self.buffers.host("sample_slots")[num_samples:padded_samples] = self.pad_slot

    def fill_decode_padding(self, start: int, padded: int) -> None:
        """Rows [start, padded) of a padded decode batch: the always-done pad slot, K/V written
        to the scratch block, one context token, so they cost a little work and touch nothing real."""
        if start >= padded:
            return
        buf = self.buffers
        pad = slice(start, padded)
        idx = np.arange(start, padded)
        buf.host("token_ids")[pad] = 0
        buf.host("positions")[pad] = 0
        buf.host("audio_src_slot")[pad] = self.pad_slot
        buf.host("slot_mapping")[pad] = self.scratch_block * self.block_size
        buf.host("ref_row_index")[pad] = -1
        buf.host("sample_token_index")[pad] = idx
        buf.host("sample_slots")[pad] = self.pad_slot
        buf.host_query_start_loc()[start + 1 : padded + 1] = idx + 1
        buf.host_seq_lens()[pad] = 1
        bt = buf.host_block_tables()
        bt[pad] = 0
        bt[pad, 0] = self.scratch_block
