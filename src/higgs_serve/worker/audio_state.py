"""Per-slot delay / ramp / done state on the device, branch-free (docs/model.md#delay-pattern).

Each request owns a persistent slot (a row of preallocated tensors). Every decode step the
runner calls `step(slots, logits)`: masks from the state -> `sample_codes` -> state update,
all with fixed shapes, gathers/scatters indexed by the `slots` tensor and `torch.where`, no
host sync: the whole step can be captured in a CUDA graph.

State per slot (row index t = rows sampled so far = index of the row being sampled):
- `delay` d (0..7): codebooks q > d are still in their leading BOC window.
- `ramp` r: -1 = normal mode; 7..1 = ramp rows still to emit; 0 = done.
- `row_index`, `last_row` [8] (the previous delayed row: the next step's input).
- sampling knobs (temperature, top_k, top_p, seed) and the frame limits.

Rules (docs/model.md#delay-pattern and #length-caps):
- normal mode: q > d forced BOC; q <= d may not emit BOC; q > 0 may not emit EOC; codebook 0
  may not emit EOC while t < min_frames, and is forced to EOC once t >= max_frames (the cap
  wins if the two overlap). After sampling d += 1 (up to 7).
- codebook 0 emits EOC at row R: r = 7. Ramp row R + k (k = 1..7): codebooks 0..k-1 forced
  EOC, the others may emit neither BOC nor EOC (codebooks q > d, possible only when R < 7 under
  a tiny cap, stay forced to BOC). After row R + 7 the slot is done: R + 8 rows in total, equal
  to `apply_delay` of the R frames plus the EOC frame [EOC, 7 free codes], hence exactly R
  frames after `rows_to_codec_frames(rows, finished_naturally=True)`.
- a done slot is frozen: its rows are all EOC and its state (row_index, last_row, ...) no
  longer changes; callers ignore them. Freed slots and the spare `pad_slot` are done, so a
  CUDA-graph batch can be padded with `pad_slot` (repeated: its writes are identical, hence
  deterministic). Warm up and capture with a slots tensor full of `pad_slot`: nothing real
  changes; replay after copying the real slots (and logits) into the captured inputs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from higgs_serve.model.delay_pattern import CODEBOOK_VOCAB_SIZE, NUM_CODEBOOKS, boc_id, eoc_id
from higgs_serve.worker.sampler import sample_codes

_RAMP_NORMAL = -1
_RAMP_DONE = 0
_INT64_MIN, _UINT64_END = -(1 << 63), 1 << 64


class SamplingKnobs(Protocol):
    """What `add` reads from a request's sampling params (SamplingParams fits)."""
    temperature: float
    top_k: int | None
    top_p: float
    seed: int | None


def _seed_as_int64(seed: int) -> int:
    """Map a seed in [-2^63, 2^64) onto the int64 bit pattern the RNG hashes."""
    if not _INT64_MIN <= seed < _UINT64_END:
        raise ValueError(f"sampling.seed {seed} does not fit in 64 bits")
    return seed - _UINT64_END if seed >= (1 << 63) else seed


class AudioState:
    def __init__(self, max_slots: int, device: torch.device | str = "cpu",
                 vocab_size: int = CODEBOOK_VOCAB_SIZE, compile: bool = False,
                 num_codebooks: int = NUM_CODEBOOKS):
        """compile: run the masks and the sampler through `torch.compile` (fuses ~40
        elementwise kernels; on an H200 at B = 64 a graph-replayed step drops from ~300 us to
        ~90 us). Compile before capturing CUDA graphs; leave it off on CPU and in unit tests."""
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.max_slots = max_slots
        self.pad_slot = max_slots  # a spare, always-done row for padding graph batches
        self.vocab_size = vocab_size
        self.num_codebooks = num_codebooks
        self.max_delay = num_codebooks - 1  # the last codebook's lag
        self.boc, self.eoc = boc_id(vocab_size), eoc_id(vocab_size)
        self.device = torch.device(device)
        n, dev = max_slots + 1, self.device
        i64 = dict(dtype=torch.int64, device=dev)
        self.delay = torch.zeros(n, **i64)
        self.ramp = torch.zeros(n, **i64)
        self.row_index = torch.zeros(n, **i64)
        self.last_row = torch.zeros(n, num_codebooks, **i64)
        self.max_frames = torch.zeros(n, **i64)
        self.min_frames = torch.zeros(n, **i64)
        self.temperature = torch.zeros(n, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(n, **i64)
        self.top_p = torch.zeros(n, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(n, **i64)
        # constants for the masks: created once so step() allocates no host data
        self._codebook = torch.arange(num_codebooks, **i64)  # [8]
        vocab = torch.arange(vocab_size, **i64)  # [V]
        self._is_real = vocab < self.boc
        self._is_boc = vocab == self.boc
        self._is_eoc = vocab == self.eoc
        for slot in range(n):
            self.remove(slot)
        self._masks = torch.compile(self._build_masks) if compile else self._build_masks
        self._sample = torch.compile(sample_codes) if compile else sample_codes

    # ---- host-side slot management (not captured) -------------------------------------
    def _check_slot(self, slot: int, allow_pad: bool = False) -> None:
        limit = self.max_slots + (1 if allow_pad else 0)
        if not 0 <= slot < limit:
            raise ValueError(f"slot {slot} out of range [0, {limit})")

    def add(self, slot: int, sampling: SamplingKnobs, max_frames: int, min_frames: int) -> None:
        """Reset `slot` for a newly scheduled request (host -> device scalar writes)."""
        self._check_slot(slot)
        if sampling.seed is None:
            raise ValueError("sampling.seed must be resolved before a request reaches the worker")
        if max_frames < 0:
            raise ValueError(f"max_frames must be >= 0, got {max_frames}")
        if min_frames < 0:
            raise ValueError(f"min_frames must be >= 0, got {min_frames}")
        self.delay[slot] = 0
        self.ramp[slot] = _RAMP_NORMAL
        self.row_index[slot] = 0
        self.last_row[slot] = self.boc  # never embedded: row 0 comes from the prompt
        self.max_frames[slot] = max_frames
        self.min_frames[slot] = min_frames
        self.temperature[slot] = float(sampling.temperature)
        self.top_k[slot] = 0 if sampling.top_k is None else int(sampling.top_k)
        self.top_p[slot] = float(sampling.top_p)
        self.seed[slot] = _seed_as_int64(int(sampling.seed))

    def remove(self, slot: int) -> None:
        """Park `slot` as done with neutral knobs (so padding through it stays harmless)."""
        self._check_slot(slot, allow_pad=True)
        self.delay[slot] = self.max_delay
        self.ramp[slot] = _RAMP_DONE
        self.row_index[slot] = 0
        self.last_row[slot] = self.eoc
        self.max_frames[slot] = 0
        self.min_frames[slot] = 0
        self.temperature[slot] = 1.0
        self.top_k[slot] = 0
        self.top_p[slot] = 1.0
        self.seed[slot] = 0

    # ---- device-side, graph-capturable ------------------------------------------------
    @property
    def done(self) -> torch.Tensor:
        """[max_slots + 1] bool."""
        return self.ramp == _RAMP_DONE

    def input_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """slots: [B] int64 -> the last sampled delayed rows [B, 8] (next step's input)."""
        return self.last_row.index_select(0, slots)

    def masks(self, slots: torch.Tensor) -> torch.Tensor:
        """slots: [B] int64 -> allowed: [B, 8, V] bool, the rules of docs/model.md#delay-pattern for the next row."""
        return self._masks(slots)

    def _build_masks(self, slots: torch.Tensor) -> torch.Tensor:
        q = self._codebook[None, :]  # [1, 8]
        d = self.delay.index_select(0, slots)[:, None]  # [B, 1]
        r = self.ramp.index_select(0, slots)[:, None]
        t = self.row_index.index_select(0, slots)[:, None]
        normal = r == _RAMP_NORMAL
        # ramp row k = 8 - r forces codebooks < k; a done slot (r = 0) forces all 8
        ramp_lock = torch.where(normal, 0, self.num_codebooks - r)  # [B, 1]
        capped = normal & (t >= self.max_frames.index_select(0, slots)[:, None])
        forced_eoc = (q < ramp_lock) | (capped & (q == 0))  # [B, 8]
        forced_boc = (q > d) & ~forced_eoc
        free = ~(forced_eoc | forced_boc)
        eoc_ok = normal & (q == 0) & (t >= self.min_frames.index_select(0, slots)[:, None])
        return ((free[:, :, None] & self._is_real)
                | (forced_boc[:, :, None] & self._is_boc)
                | ((forced_eoc | (free & eoc_ok))[:, :, None] & self._is_eoc))

    def step(self, slots: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots: [B] int64 (distinct, except `pad_slot` which may repeat); logits: [B, 8, V].

        Returns rows: [B, 8] int64, the delayed row sampled for each slot (all EOC for a slot
        that was already done), and done: [B] bool, the slots that are done after this row
        (newly finished = done now and not done before).
        """
        allowed = self.masks(slots)
        rows = self._sample(
            logits, self.temperature.index_select(0, slots), self.top_k.index_select(0, slots),
            self.top_p.index_select(0, slots), self.seed.index_select(0, slots),
            self.row_index.index_select(0, slots), allowed,
        )
        d = self.delay.index_select(0, slots)
        r = self.ramp.index_select(0, slots)
        t = self.row_index.index_select(0, slots)
        was_done = r == _RAMP_DONE
        starts_ramp = (r == _RAMP_NORMAL) & (rows[:, 0] == self.eoc)
        new_r = torch.where(starts_ramp, self.max_delay, torch.where(r > 0, r - 1, r))
        new_d = torch.where(was_done, d, (d + 1).clamp_max(self.max_delay))
        new_t = torch.where(was_done, t, t + 1)
        new_last = torch.where(was_done[:, None], self.last_row.index_select(0, slots), rows)
        self.ramp.index_copy_(0, slots, new_r)
        self.delay.index_copy_(0, slots, new_d)
        self.row_index.index_copy_(0, slots, new_t)
        self.last_row.index_copy_(0, slots, new_last)
        return rows, new_r == _RAMP_DONE
