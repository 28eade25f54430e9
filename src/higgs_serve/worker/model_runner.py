"""Stage 0 runner: executes one `StepPlan` on the Talker and returns one `StepResult`.

The runner owns the device: the talker weights, the paged KV cache, the per-slot audio state and
the preallocated input buffers. It never decides policy: which requests run, how many tokens each
gets and which blocks they use all come from the plan. Per step it does one host→device copy of
each packed input area (int64 fields, int32 attention fields; plus the reference rows of clone
prompts in their prefill), and one device→host copy of the sampled rows and done flags.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan, StepResult
from higgs_serve.model.fused_ops import gemm_row_blocks, warm_up_gemms
from higgs_serve.model.skinny_gemm import MAX_ROWS as SKINNY_MAX_ROWS
from higgs_serve.model.talker import Talker
from higgs_serve.progress import ProgressCallback  # on_progress(done, total, label) after each captured size
from higgs_serve.worker.attention.backend import AttentionBackend
from higgs_serve.worker.attention.metadata import AttentionMetadata
from higgs_serve.worker.audio_state import AudioState
from higgs_serve.worker.cuda_graphs import (CaptureSize, CudaGraphDispatcher, CudaGraphMode, MLPGraphs,
                                            SizedGraphs, timed_capture)
from higgs_serve.worker.eager_tapes import EagerTapes
from higgs_serve.worker.input_buffers import InputBuffers, StepInputs
from higgs_serve.worker.piecewise import PieceIO, PiecewiseGraphs, build_pieces, run_pieces
from higgs_serve.worker.step_staging import Staged, StepStager

logger = logging.getLogger(__name__)

TAPE_ROW_QUANTUM = 8  # taped prefill and mixed steps run their token count padded to this
# Eager steps of up to this many rows are taped: past SKINNY_MAX_ROWS their GEMMs run as row
# blocks on the skinny kernel (fused_ops.gemm_row_blocks), a second read of the weights that costs
# the GPU ~1.7 ms a step at the 4B talker's bandwidth, against host time an op-by-op step of this
# size spends several times over (the high-throughput profile's mixed steps at c = 64: ~63
# decodes and a prompt chunk)
TAPE_MAX_ROWS = 2 * SKINNY_MAX_ROWS
# How eager steps ran, the keys of `ModelRunner.eager_steps` (metrics): from a launch tape, op by
# op while recording one, recorded but not kept (void), op by op without a tape
EAGER_OUTCOMES = ("replay", "recorded", "void", "op_by_op")


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int
    # K/V storage (kv_cache_dtype resolved): None = the runner's compute dtype; fp8 is cast on
    # write and upcast on read by the attention backend.
    dtype: torch.dtype | None = None


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
        graphs: CudaGraphDispatcher | None = None,
        launch_tapes: bool = True,
    ):
        self.talker = talker
        self.graphs = graphs or CudaGraphDispatcher()
        self.max_model_len = max_model_len
        self.backend = backend
        self.kv = kv
        self.device = device
        self.dtype = dtype
        self.kv_cache_dtype = kv.dtype or dtype
        self.num_codebooks = talker.audio_cfg.num_codebooks
        # One extra block past the scheduler's pool: padded graph rows write their K/V there.
        self.scratch_block = kv.num_blocks
        self.kv_caches = backend.allocate_kv_cache(
            num_layers=talker.text_cfg.num_layers,
            num_blocks=kv.num_blocks + 1,
            block_size=kv.block_size,
            num_kv_heads=talker.text_cfg.num_kv_heads,
            head_dim=talker.text_cfg.head_dim,
            dtype=self.kv_cache_dtype,
            device=device,
        )
        max_blocks = -(-max_model_len // kv.block_size)
        max_tokens = max(max_num_batched_tokens, max(self.graphs.piecewise_sizes, default=0))
        self.max_num_seqs = max_num_seqs
        self.buffers = InputBuffers(max_tokens, max_num_seqs, max_blocks, device)
        # reference rows of clone prompts in this step's prefill, indexed by ref_row_index
        self._ref_dev = torch.zeros(max_tokens, self.num_codebooks, dtype=torch.int64, device=device)
        self._piece_io: PieceIO | None = None
        if self.graphs.piecewise_sizes:
            text = talker.text_cfg
            shape = (max_tokens, text.num_heads, text.head_dim)
            self._piece_io = PieceIO(q=torch.zeros(shape, dtype=dtype, device=device),
                                     o=torch.zeros(shape, dtype=dtype, device=device))
        self.audio_state = AudioState(max_slots=max_num_seqs, device=device, vocab_size=talker.audio_cfg.codebook_size,
                                      num_codebooks=self.num_codebooks)
        self.stager = StepStager(self.buffers, kv.block_size, self.num_codebooks, self.audio_state.pad_slot,
                                 self.scratch_block)
        # rows [S, 8] + done flag: written on the device (inside graphs too), copied back once per step
        out_shape = (max_num_seqs, self.num_codebooks + 1)
        self._out_dev = torch.zeros(out_shape, dtype=torch.int64, device=device)
        # two host copies: step N's result lands in one while step N+1 is staged (lookahead)
        self._out_hosts = [torch.zeros(out_shape, dtype=torch.int64, pin_memory=device.type == "cuda")
                           for _ in range(2)]
        self._mlp_graphs: MLPGraphs | None = None
        self._full_graphs: SizedGraphs | None = None
        self._sampler_graphs: SizedGraphs | None = None  # sampling tails of eager steps
        self._sample_hidden: torch.Tensor | None = None  # their static input rows
        self._piecewise: PiecewiseGraphs | None = None
        # launch tapes of eager steps of up to TAPE_MAX_ROWS tokens (CUDA only: they replay cached
        # Triton launches); False runs every eager step op by op (benchmarks compare the two)
        self.tapes = EagerTapes(device, self._persistent_tensors) if launch_tapes and device.type == "cuda" else None
        self._tape_rows = min(TAPE_MAX_ROWS, self.buffers.max_tokens)  # the most token rows a taped step has
        # how each step mode runs a staged step: (plan, staged, padded size) -> None
        self._launchers: dict[CudaGraphMode, Callable[[StepPlan, Staged, int], None]] = {
            CudaGraphMode.FULL: self._run_full_graph,
            CudaGraphMode.PIECEWISE: self._run_piecewise,
            CudaGraphMode.LOCAL_MLP: lambda plan, staged, padded: self._run_eager(plan, staged, self._mlp_graphs.at(padded)),
            CudaGraphMode.NONE: lambda plan, staged, padded: self._run_eager(plan, staged, None),
        }
        self.step_modes = {mode: 0 for mode in self._launchers}  # steps run per step mode (metrics)
        self._untaped_steps = 0  # eager steps that did not go through the tapes (see eager_steps)
        self.capture_info: list[dict] = []
        # Steps run on the device's highest-priority stream: the codec's kernels (Stage 1, its own
        # default-priority stream) then fill the SMs a decode step leaves idle instead of
        # delaying it, and the block scheduler hands freed SMs to the step first.
        self._step_stream = torch.cuda.Stream(device, priority=-100) if device.type == "cuda" else None
        self._follow_setup_work()

    # ------------------------------------------------------------------ per-request setup
    def _add_request(self, new: NewRequestData) -> None:
        self.stager.add(new)
        self.audio_state.add(new.slot, new.sampling, new.max_frames, new.min_frames)

    # ------------------------------------------------------------------ step
    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step and wait for its rows."""
        return self.collect(self.launch(plan))

    def _follow_setup_work(self) -> None:
        """Order the step stream after what set-up enqueued on the current stream (allocations,
        warm-ups, captures)."""
        if self._step_stream is not None:
            self._step_stream.wait_stream(torch.cuda.current_stream(self.device))

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> _Pending:
        """Enqueue one step on the device and return at once (one-step lookahead): the caller may
        schedule and launch the next plan before `collect`ing this one. Device work is stream
        ordered (one step stream), so the next step sees this step's audio state and KV writes."""
        if self._step_stream is None:
            return self._launch(plan)
        with torch.cuda.stream(self._step_stream):
            return self._launch(plan)

    def _launch(self, plan: StepPlan) -> _Pending:
        self.buffers.flip()
        out_host = self._out_hosts[self.buffers.current]  # double-buffered in step with the inputs
        for slot in plan.released_slots:
            self.stager.release(slot)
        for new in plan.new_requests:
            self._add_request(new)
        if not plan.chunks:
            return _Pending(plan.step_id, [], out_host, None)
        staged = self.stager.stage(plan)
        pure_decode = not staged.has_text and staged.num_tokens == len(plan.chunks)
        mode, padded = self.graphs.dispatch(staged.num_tokens, pure_decode)
        self.step_modes[mode] += 1
        self._launchers[mode](plan, staged, padded)
        return self._copy_out(plan.step_id, staged.sample_ids, out_host)

    def _run_full_graph(self, plan: StepPlan, staged: Staged, padded: int) -> None:
        """Replay the whole decode step's graph of batch `padded`."""
        self.stager.fill_decode_padding(staged.num_tokens, padded)
        self.buffers.upload(padded)
        self._full_graphs.replay(padded)

    def _run_eager(self, plan: StepPlan, staged: Staged, mlp: Callable | None) -> None:
        """Run the forward op by op (with `mlp`, the layers' MLP graphs of the step's size), then
        its sampling tail, from a graph when one serves the step's sample count."""
        samples = len(staged.sample_ids)
        sampler = self._sampler_graphs.padded(samples) if self._sampler_graphs and samples else None
        if sampler is not None:
            self.stager.fill_sample_padding(samples, sampler)
        rows = self._eager_rows(staged, len(plan.chunks))
        if rows > staged.num_tokens:
            self.stager.fill_token_padding(staged.num_tokens, rows, samples, samples)
        inputs = self._upload(staged, len(plan.chunks), rows)
        attention = self._step_attention(inputs, staged)
        self._sample_eager(inputs, self._forward_eager(inputs, attention, mlp), sampler)

    def _eager_rows(self, staged: Staged, num_seqs: int) -> int:
        """The token rows an eager step runs. A prefill or mixed step a launch tape can hold runs
        its count padded up to a multiple of TAPE_ROW_QUANTUM, so that steps of nearby sizes
        share a tape (the padding rows belong to no request and write no K/V; every op but
        attention is row by row, and a GEMM row block's launch shape only changes at 16, 32 and
        64 rows, so the real rows' bits are those of the unpadded step). Decodes run exactly."""
        n = staged.num_tokens
        if self.tapes is None or (n == num_seqs and not staged.has_text):
            return n
        padded = -(-n // TAPE_ROW_QUANTUM) * TAPE_ROW_QUANTUM
        return padded if padded <= self._tape_rows else n

    def _forward_eager(self, inputs: StepInputs, attention, mlp: Callable | None) -> torch.Tensor:
        """The talker's forward op by op; its decoder stack from the launch tape of the step's
        shape (eager_tapes.py) where one is recorded or can be."""
        backbone = self.talker.backbone
        embeds = self._embed(inputs)
        cos, sin = backbone.rotary(inputs.positions, embeds.dtype)

        def decoder(e: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor]:
            return (backbone.decoder(e, c, s, attention, mlp),)

        # taped or not, the same kernels: past TAPE_MAX_ROWS the GEMMs run on cuBLAS, which no
        # tape can hold
        with gemm_row_blocks(TAPE_MAX_ROWS):
            if self.tapes is not None and inputs.num_tokens <= self._tape_rows:
                # the key: everything the launches depend on (the buffers' addresses never change)
                key = (inputs.num_tokens, mlp is not None, *attention.launch_key())
                hidden = self.tapes.run(key, decoder, embeds, cos, sin)
            else:
                self._untaped_steps += 1
                hidden = decoder(embeds, cos, sin)[0]
        return backbone.norm(hidden)

    @property
    def eager_steps(self) -> dict[str, int]:
        """How the eager steps so far ran, per EAGER_OUTCOMES (every one op by op without tapes)."""
        outcomes = self.tapes.outcomes if self.tapes is not None else {}
        counts = {outcome: outcomes.get(outcome, 0) for outcome in EAGER_OUTCOMES}
        counts["op_by_op"] += self._untaped_steps
        return counts

    def _persistent_tensors(self) -> list[torch.Tensor]:
        """Every device tensor an eager forward reads or writes that lives as long as the runner."""
        tensors = [*self.talker.parameters(), *self.talker.buffers(), *self.buffers.device_tensors(), self._ref_dev]
        tensors += [t for pair in self.kv_caches for t in pair]
        if self._mlp_graphs is not None:
            tensors += self._mlp_graphs.static_tensors()
        if self._piece_io is not None:
            tensors += [self._piece_io.q, self._piece_io.o]
        return tensors

    def _upload(self, staged: Staged, num_seqs: int, num_tokens: int | None = None) -> StepInputs:
        """Copy the staged step (and a clone prefill's reference rows) to the device; its views
        (of `num_tokens` rows when the step was padded)."""
        self.buffers.upload(num_seqs)
        if staged.ref_parts:
            rows = torch.from_numpy(np.concatenate(staged.ref_parts))
            self._ref_dev[: rows.shape[0]].copy_(rows.to(self.device, non_blocking=True))
        return self.buffers.views(num_tokens or staged.num_tokens, num_seqs, len(staged.sample_ids), staged.has_audio,
                                  staged.has_text)

    def _run_piecewise(self, plan: StepPlan, staged: Staged, padded: int) -> None:
        """Replay the piecewise graphs of `padded` tokens, attention eager in between."""
        samples = self._piecewise_samples(padded)
        self.stager.fill_token_padding(staged.num_tokens, padded, len(staged.sample_ids), samples)
        inputs = self._upload(staged, len(plan.chunks))
        attention = self._step_attention(inputs, staged)
        n = staged.num_tokens
        q, o = self._piece_io.q[:n], self._piece_io.o[:n]

        def attend(layer_idx: int) -> None:
            attention.attend(layer_idx, q, out=o)

        if self._piecewise is not None:
            self._piecewise.replay(padded, attend)
        else:  # not captured (no CUDA): the same pieces, run directly
            run_pieces(self._pieces(padded), attend)

    def _piecewise_samples(self, padded_tokens: int) -> int:
        """Sampled rows of a piecewise step of `padded_tokens` tokens (at most one per request)."""
        return min(padded_tokens, self.max_num_seqs)

    def _embed(self, inputs: StepInputs) -> torch.Tensor:
        talker = self.talker
        if not inputs.has_text_inputs:
            return talker.embed_audio(self.audio_state.input_rows(inputs.audio_src_slot))
        embeds = talker.embed_text(inputs.token_ids)
        if not inputs.has_audio_inputs:
            return embeds
        # audio inputs replace (never add to) the token embedding
        rows = self.audio_state.input_rows(inputs.audio_src_slot.clamp(min=0))
        use_ref = (inputs.ref_row_index >= 0).unsqueeze(1)
        rows = torch.where(use_ref, self._ref_dev[inputs.ref_row_index.clamp(min=0)], rows)
        is_audio = ((inputs.audio_src_slot >= 0) | (inputs.ref_row_index >= 0)).unsqueeze(1)
        return torch.where(is_audio, talker.embed_audio(rows), embeds)

    def _attention(self, inputs: StepInputs, max_query_len: int, max_seq_len: int, num_decodes: int = 0):
        meta = AttentionMetadata(
            query_start_loc=inputs.query_start_loc,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            slot_mapping=inputs.slot_mapping,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            num_decodes=num_decodes,
        )
        return self.backend.bind(meta, self.kv_caches)

    def _step_attention(self, inputs: StepInputs, staged: Staged):
        """The step's attention, its host maxima read from the staged host copies (no sync)."""
        qsl = self.buffers.host_query_start_loc()[: inputs.num_seqs + 1]
        max_seq_len = int(self.buffers.host_seq_lens()[: inputs.num_seqs].max())
        return self._attention(inputs, int(np.max(np.diff(qsl))), max_seq_len, staged.num_decodes)

    def _sample_eager(self, inputs: StepInputs, hidden: torch.Tensor, padded: int | None) -> None:
        """Sample the step's rows from its hidden states: by replaying the sampling graph of
        `padded` rows (its sample slots padded at staging), or op by op when it is None."""
        s = inputs.num_samples
        if s == 0:
            return
        if padded is not None:
            torch.index_select(hidden, 0, inputs.sample_token_index, out=self._sample_hidden[:s])
            self._sampler_graphs.replay(padded)
            return
        logits = self.talker.audio_logits(hidden[inputs.sample_token_index])
        self._sample_into_out(inputs.sample_slots, logits, s)

    def _sample_body(self, n: int) -> None:
        """The sampling tail of n (padded) rows from the static hidden rows (captured)."""
        logits = self.talker.audio_logits(self._sample_hidden[:n])
        self._sample_into_out(self.buffers.dev("sample_slots", n), logits, n)

    def _sample_into_out(self, slots: torch.Tensor, logits: torch.Tensor, s: int) -> None:
        rows, done = self.audio_state.step(slots, logits)
        self._out_dev[:s, : self.num_codebooks].copy_(rows)
        self._out_dev[:s, self.num_codebooks].copy_(done)

    def _copy_out(self, step_id: int, sample_ids: list[str], out_host: torch.Tensor) -> _Pending:
        """Enqueue the one device→host copy of the step: sampled rows and done flags."""
        s = len(sample_ids)
        if s:
            out_host[:s].copy_(self._out_dev[:s], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return _Pending(step_id, sample_ids, out_host, event)

    def collect(self, pending: _Pending) -> StepResult:
        """Wait for a launched step and read its rows (the step's only host sync)."""
        step_id, sample_ids = pending.step_id, pending.sample_ids
        s = len(sample_ids)
        if pending.event is not None:
            pending.event.synchronize()
        if s == 0:
            return StepResult(step_id=step_id, rows={}, finished=())
        out = pending.out_host[:s].numpy()
        nc = self.num_codebooks
        # one copy of the block (this host buffer is reused two steps on), then a row view each:
        # at hundreds of rows a step, building a tuple per row was a third of the output work
        codes = out[:, :nc].copy()
        finished = tuple(sample_ids[i] for i in np.flatnonzero(out[:, nc]))
        return StepResult(step_id=step_id, rows=dict(zip(sample_ids, codes)), finished=finished)

    # ------------------------------------------------------------------ graphs
    def _decode_body(self, n: int) -> None:
        """The whole decode step for a padded batch of n, on the static buffers (captured)."""
        inputs = self.buffers.views(n, n, n, True, False)
        # max_seq_len: an upper bound, the graph must not bake in a length
        attention = self._attention(inputs, max_query_len=1, max_seq_len=self.max_model_len)
        embeds = self.talker.embed_audio(self.audio_state.input_rows(inputs.audio_src_slot))
        hidden = self.talker(embeds, inputs.positions, attention)
        self._sample_into_out(inputs.sample_slots, self.talker.audio_logits(hidden), n)

    def _pieces(self, n: int) -> list:
        """The step of n (padded) tokens as piecewise-graph pieces, on the static buffers."""
        samples = self._piecewise_samples(n)
        inputs = self.buffers.views(n, self.max_num_seqs, samples, True, True)
        writer = self._attention(inputs, max_query_len=0, max_seq_len=0)  # pieces only write K/V

        def finish(hidden: torch.Tensor) -> None:
            logits = self.talker.audio_logits(hidden[inputs.sample_token_index])
            self._sample_into_out(inputs.sample_slots, logits, samples)

        return build_pieces(self.talker.backbone, lambda: self._embed(inputs), inputs.positions,
                            writer.write, self._piece_io, finish)

    @torch.inference_mode()
    def capture_graphs(self, on_progress: ProgressCallback | None = None) -> list[dict]:
        """Compile the attention kernels for every batch size and capture every graph of the
        mode now, at start-up (never lazily on live traffic). `on_progress(done, total, label)`
        is called after each captured size, `total` being the sizes of every kind together."""
        self.backend.warm_up(self.kv_caches, self.talker.text_cfg.num_heads, self.max_num_seqs, self.scratch_block,
                             self.buffers.max_blocks, self.dtype)
        layer = self.talker.backbone.layers[0]
        warm_up_gemms(layer.ops, layer.run_gemms)
        captures = self._graph_captures() if self.device.type == "cuda" else []
        pool = torch.cuda.graph_pool_handle() if captures else None
        stream = torch.cuda.Stream(self.device) if captures else None
        total, done = sum(len(sizes) for _, sizes, _ in captures), 0
        for kind, sizes, prepare in captures:  # one loop over (kind, sizes): largest size first
            capture_size = prepare()

            def capture_all(kind=kind, sizes=sizes, capture_size=capture_size) -> None:
                nonlocal done
                for n in sorted(sizes, reverse=True):
                    capture_size(n, pool, stream)
                    done += 1
                    if on_progress is not None:
                        on_progress(done, total, f"{kind} graph, size {n}")

            self.capture_info.append(timed_capture(kind, sizes, capture_all, self.device))
        self._follow_setup_work()
        self.record_prefill_tapes()
        return self.capture_info

    def record_prefill_tapes(self) -> int:
        """Record the launch tapes of one-prompt prefill steps, every taped size, before any
        request: a step shape's first run goes op by op while its tape is recorded, and a fresh
        server's first prompt of each length would pay that in time to first audio. Each prompt is
        staged for slot 0 with its K/V on the scratch block (where padded decode rows write theirs),
        and the slot is released after. Returns the prefill steps run (0 without tapes)."""
        if self.tapes is None:
            return 0
        t0 = time.perf_counter()
        limit = min(self._tape_rows, self.max_model_len)
        sampling = SamplingParams(seed=0, max_new_tokens=1)
        # one prompt length per tape key: its padded rows, and its query tiles, which change only
        # at multiples of 32 tokens (so every length of an 8-token group shares them); only the
        # sizes that run eagerly (a piecewise profile's prefill replays its graphs; prefill and
        # mixed steps never take the MLP graphs: LOCAL_MLP's mixed mode is NONE)
        lengths = [n for n in range(TAPE_ROW_QUANTUM, limit + 1, TAPE_ROW_QUANTUM)
                   if self.graphs.dispatch(n, False)[0] is CudaGraphMode.NONE]
        for length in lengths:
            new = NewRequestData(request_id=f"prefill-tape-{length}", slot=0, prompt_token_ids=(0,) * length,
                                 placeholder_rows=None, placeholder_start=0, sampling=sampling, max_frames=1,
                                 min_frames=0)
            pages = (self.scratch_block,) * -(-length // self.kv.block_size)
            chunk = ScheduledChunk(new.request_id, 0, 0, length, pages, samples=True)
            self.execute(StepPlan(step_id=-1, new_requests=(new,), chunks=(chunk,), released_slots=()))
            self.stager.release(0)
        self.reset_step_counts()
        logger.info("recorded the launch tapes of %d prefill sizes in %.2f s", len(lengths), time.perf_counter() - t0)
        return len(lengths)

    def reset_step_counts(self) -> None:
        """Serving's step counts (metrics) start at zero after the start-up's own steps."""
        self.step_modes = dict.fromkeys(self.step_modes, 0)
        if self.tapes is not None:
            self.tapes.outcomes.clear()
        self._untaped_steps = 0

    def _graph_captures(self) -> list[tuple[str, tuple[int, ...], Callable[[], CaptureSize]]]:
        """The graph kinds of the mode, in capture order: (kind, sizes, prepare), where
        `prepare()` makes the kind's graph set and static inputs and returns its
        `capture(n, pool, stream)`."""
        graphs = self.graphs
        decode_sizes, warmups = graphs.decode_sizes, graphs.num_warmups
        text = self.talker.text_cfg

        def prepare_mlp() -> CaptureSize:
            self._mlp_graphs = MLPGraphs(self.talker.backbone.layers, text.hidden_size, decode_sizes, self.dtype,
                                         self.device)
            return lambda n, pool, stream: self._mlp_graphs.capture_size(n, pool, warmups, stream)

        def prepare_full() -> CaptureSize:
            self._full_graphs = SizedGraphs(decode_sizes)
            return lambda n, pool, stream: self._full_graphs.capture_size(n, self._decode_body, pool, warmups, stream)

        def prepare_sampling() -> CaptureSize:
            self._sample_hidden = torch.zeros(decode_sizes[-1], text.hidden_size, dtype=self.dtype, device=self.device)
            self._sampler_graphs = SizedGraphs(decode_sizes)
            return lambda n, pool, stream: self._sampler_graphs.capture_size(n, self._sample_body, pool, warmups,
                                                                             stream)

        def prepare_piecewise() -> CaptureSize:
            self._piecewise = PiecewiseGraphs(graphs.piecewise_sizes)
            largest = graphs.piecewise_sizes[-1]
            self.stager.fill_token_padding(0, largest, 0, self._piecewise_samples(largest))
            self.buffers.upload(0)
            # at least one eager run of the whole chain: each piece's kernels must exist before any
            # piece is captured (the deploy config documents this floor)
            return lambda n, pool, stream: self._piecewise.capture_size(n, self._pieces, pool, max(1, warmups), stream)

        if decode_sizes:  # static inputs: every row a padding row (pad slot, scratch block)
            self.stager.fill_decode_padding(0, decode_sizes[-1])
            self.buffers.upload(decode_sizes[-1])
        table = ((CudaGraphMode.LOCAL_MLP, "MLP", decode_sizes, prepare_mlp),
                 (CudaGraphMode.FULL, "full decode", decode_sizes, prepare_full),
                 (None, "sampling", decode_sizes, prepare_sampling),  # the eager steps' sampling tails
                 (CudaGraphMode.PIECEWISE, "piecewise", graphs.piecewise_sizes, prepare_piecewise))
        modes = (graphs.mode.decode_mode, graphs.mode.mixed_mode)
        return [(kind, sizes, prepare) for mode, kind, sizes, prepare in table
                if sizes and (mode is None or mode in modes)]


@dataclass
class _Pending:
    """A launched step: where its rows will land and the event that says they have."""

    step_id: int
    sample_ids: list[str]
    out_host: torch.Tensor
    event: torch.cuda.Event | None
