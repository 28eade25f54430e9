"""Stage 0 runner: executes one `StepPlan` on the Talker and returns one `StepResult`.

The runner owns the device: the talker weights, the paged KV cache, the per-slot audio state and
the preallocated input buffers. It never decides policy: which requests run, how many tokens each
gets and which blocks they use all come from the plan. Per step it does one host→device copy of
the packed inputs and one device→host copy of the sampled rows and done flags.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from higgs_serve.engine.outputs import NewRequestData, StepPlan, StepResult
from higgs_serve.model.talker import Talker
from higgs_serve.worker.attention.backend import AttentionBackend
from higgs_serve.worker.attention.metadata import AttentionMetadata
from higgs_serve.worker.audio_state import AudioState
from higgs_serve.worker.input_buffers import InputBuffers, StepInputs

logger = logging.getLogger(__name__)


@dataclass
class _SlotPrompt:
    """Host copy of what a slot's prompt needs: token ids and, for clones, the reference rows."""

    request_id: str
    token_ids: np.ndarray  # [P] int64
    ref_rows: np.ndarray | None  # [R, 8] int64 delayed reference rows for the placeholder span
    ref_start: int


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int


class ModelRunner:
    def __init__(
        self,
        talker: Talker,
        backend: AttentionBackend,
        kv: KVCacheSpec,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.talker = talker
        self.backend = backend
        self.kv = kv
        self.device = device
        self.dtype = dtype
        self.max_num_seqs = max_num_seqs
        self.num_codebooks = talker.audio_cfg.num_codebooks
        self.kv_caches = backend.allocate_kv_cache(
            num_layers=talker.text_cfg.num_layers,
            num_blocks=kv.num_blocks,
            block_size=kv.block_size,
            num_kv_heads=talker.text_cfg.num_kv_heads,
            head_dim=talker.text_cfg.head_dim,
            dtype=dtype,
            device=device,
        )
        max_blocks = -(-max_model_len // kv.block_size)
        self.buffers = InputBuffers(max_num_batched_tokens, max_num_seqs, max_blocks, device)
        self.audio_state = AudioState(max_slots=max_num_seqs, device=device, vocab_size=talker.audio_cfg.codebook_size)
        self._prompts: dict[int, _SlotPrompt] = {}
        # rows [S, 8] + done flag, copied back once per step
        self._out_host = torch.zeros(
            (max_num_seqs, self.num_codebooks + 1), dtype=torch.int64, pin_memory=device.type == "cuda"
        )

    # ------------------------------------------------------------------ per-request setup
    def _add_request(self, new: NewRequestData) -> None:
        ref_rows = None
        if new.placeholder_rows is not None:
            ref_rows = np.asarray(new.placeholder_rows, dtype=np.int64).reshape(-1, self.num_codebooks)
        self._prompts[new.slot] = _SlotPrompt(
            request_id=new.request_id,
            token_ids=np.asarray(new.prompt_token_ids, dtype=np.int64),
            ref_rows=ref_rows,
            ref_start=new.placeholder_start,
        )
        self.audio_state.add(new.slot, new.sampling, new.max_frames, new.min_frames)

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        for slot in plan.released_slots:
            self._prompts.pop(slot, None)
        for new in plan.new_requests:
            self._add_request(new)
        if not plan.chunks:
            return StepResult(step_id=plan.step_id, rows={}, finished=())
        inputs, ref_rows, sample_ids = self._prepare(plan)
        hidden = self._forward(inputs, ref_rows)
        return self._sample(plan.step_id, inputs, hidden, sample_ids)

    def _prepare(self, plan: StepPlan) -> tuple[StepInputs, torch.Tensor | None, list[str]]:
        buf = self.buffers
        tok = buf.host("token_ids")
        pos = buf.host("positions")
        src = buf.host("audio_src_slot")
        smap = buf.host("slot_mapping")
        refi = buf.host("ref_row_index")
        s_tok = buf.host("sample_token_index")
        s_slot = buf.host("sample_slots")
        qsl = buf.host_query_start_loc()
        seq_lens = buf.host_seq_lens()
        bt = buf.host_block_tables()
        block_size = self.kv.block_size
        ref_parts: list[np.ndarray] = []
        num_ref = 0
        n = 0
        has_audio = has_text = False
        sample_ids: list[str] = []
        qsl[0] = 0
        for i, chunk in enumerate(plan.chunks):
            prompt = self._prompts[chunk.slot]
            p_len = len(prompt.token_ids)
            start, count = chunk.start_pos, chunk.num_tokens
            end = start + count
            positions = np.arange(start, end, dtype=np.int64)
            pos[n : n + count] = positions
            if start >= p_len:
                # decode: the input is the slot's previous delayed row (count is always 1)
                tok[n : n + count] = 0
                src[n : n + count] = chunk.slot
                refi[n : n + count] = -1
                has_audio = True
            else:
                tok[n : n + count] = prompt.token_ids[start:end]
                src[n : n + count] = -1
                refi[n : n + count] = -1
                has_text = True
                if prompt.ref_rows is not None:
                    lo = max(start, prompt.ref_start)
                    hi = min(end, prompt.ref_start + len(prompt.ref_rows))
                    if lo < hi:
                        refi[n + lo - start : n + hi - start] = np.arange(num_ref, num_ref + hi - lo)
                        ref_parts.append(prompt.ref_rows[lo - prompt.ref_start : hi - prompt.ref_start])
                        num_ref += hi - lo
                        has_audio = True
            blocks = np.asarray(chunk.block_ids, dtype=np.int64)
            smap[n : n + count] = blocks[positions // block_size] * block_size + positions % block_size
            bt[i, : len(blocks)] = blocks
            bt[i, len(blocks) :] = 0
            seq_lens[i] = end
            n += count
            qsl[i + 1] = n
            if chunk.samples:
                s_tok[len(sample_ids)] = n - 1
                s_slot[len(sample_ids)] = chunk.slot
                sample_ids.append(chunk.request_id)
        num_seqs = len(plan.chunks)
        buf.upload(num_seqs)
        inputs = buf.views(n, num_seqs, len(sample_ids), has_audio, has_text)
        ref_rows = None
        if ref_parts:
            ref_rows = torch.from_numpy(np.concatenate(ref_parts)).to(self.device, non_blocking=True)
        return inputs, ref_rows, sample_ids

    def _embed(self, inputs: StepInputs, ref_rows: torch.Tensor | None) -> torch.Tensor:
        talker = self.talker
        if not inputs.has_text_inputs:
            return talker.embed_audio(self.audio_state.input_rows(inputs.audio_src_slot))
        embeds = talker.embed_text(inputs.token_ids)
        if not inputs.has_audio_inputs:
            return embeds
        # audio inputs replace (never add to) the token embedding
        rows = self.audio_state.input_rows(inputs.audio_src_slot.clamp(min=0))
        if ref_rows is not None:
            use_ref = (inputs.ref_row_index >= 0).unsqueeze(1)
            rows = torch.where(use_ref, ref_rows[inputs.ref_row_index.clamp(min=0)], rows)
        is_audio = ((inputs.audio_src_slot >= 0) | (inputs.ref_row_index >= 0)).unsqueeze(1)
        return torch.where(is_audio, talker.embed_audio(rows), embeds)

    def _forward(self, inputs: StepInputs, ref_rows: torch.Tensor | None) -> torch.Tensor:
        meta = AttentionMetadata(
            query_start_loc=inputs.query_start_loc,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            slot_mapping=inputs.slot_mapping,
            max_query_len=0,
            max_seq_len=0,
        )
        self._fill_host_maxima(meta, inputs)
        attention = self.backend.bind(meta, self.kv_caches)
        embeds = self._embed(inputs, ref_rows)
        return self.talker(embeds, inputs.positions, attention)

    def _fill_host_maxima(self, meta: AttentionMetadata, inputs: StepInputs) -> None:
        qsl = self.buffers.host_query_start_loc()[: inputs.num_seqs + 1]
        meta.max_query_len = int(np.max(np.diff(qsl))) if inputs.num_seqs else 0
        meta.max_seq_len = int(self.buffers.host_seq_lens()[: inputs.num_seqs].max()) if inputs.num_seqs else 0

    def _sample(self, step_id: int, inputs: StepInputs, hidden: torch.Tensor, sample_ids: list[str]) -> StepResult:
        s = inputs.num_samples
        if s == 0:
            return StepResult(step_id=step_id, rows={}, finished=())
        logits = self.talker.audio_logits(hidden[inputs.sample_token_index])
        rows, done = self.audio_state.step(inputs.sample_slots, logits)
        packed = torch.cat([rows, done.to(torch.int64).unsqueeze(1)], dim=1)
        host = self._out_host[:s]
        host.copy_(packed, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        out = host.numpy()
        result_rows = {rid: tuple(int(c) for c in out[i, : self.num_codebooks]) for i, rid in enumerate(sample_ids)}
        finished = tuple(rid for i, rid in enumerate(sample_ids) if out[i, self.num_codebooks])
        return StepResult(step_id=step_id, rows=result_rows, finished=finished)
