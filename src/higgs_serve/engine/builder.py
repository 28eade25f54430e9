"""Builds a ready-to-run `EngineCore` from a model path and a validated deploy config.

Order: locate the model → parse config.json → load (or randomly build) weights → size the KV
cache from the memory left → runner, codec stage, scheduler.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from higgs_serve.codec.chunker import (
    SAMPLES_PER_FRAME,
    WindowParams,
    WindowShape,
    file_window_params,
    first_chunk_shapes,
    max_chunk_frames,
    warm_window_shapes,
)
from higgs_serve.codec.codec_runner import CodecRunner
from higgs_serve.codec.decoder import PRECISION_DTYPES, CodecDecoder, receptive_field_frames
from higgs_serve.codec.encoder import CodecEncoder
from higgs_serve.codec.weights import expected_encoder_tensors
from higgs_serve.audio.watermark import load_watermarker
from higgs_serve.config.deploy import CodecGraphPath, DeployConfig, resolve_codec_graph_path
from higgs_serve.engine.core import EngineCore, EngineHooks, EngineParts
from higgs_serve.engine.deadlines.slack_policy import SlackPolicy
from higgs_serve.engine.deadlines.stage1_load import Stage1Load
from higgs_serve.engine.deadlines.startup_timings import StartupTimings
from higgs_serve.engine.input_processor import InputProcessor
from higgs_serve.engine.kv_cache_manager import KVCacheManager
from higgs_serve.engine.mark_stage import MarkStage
from higgs_serve.engine.output_processor import OutputProcessor
from higgs_serve.engine.scheduler import Scheduler
from higgs_serve.errors import ConfigError
from higgs_serve.graph_batches import graph_batch_sizes
from higgs_serve.model.checkpoint import cast_tensors, load_checkpoint, resolve_model_dir
from higgs_serve.model.hf_config import ModelSpec, load_model_spec
from higgs_serve.model.prompt import PromptBuilder
from higgs_serve.model.talker import Talker
from higgs_serve.model.tiny import build_dummy_tensors
from higgs_serve.progress import ProgressCallback
from higgs_serve.worker.attention.selector import get_backend
from higgs_serve.worker.attention.kv_cache_dtype import kv_bytes_per_token, resolve_kv_cache_dtype
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner
from higgs_serve.worker.step_timing import time_decode_steps, time_prompt_token

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "dummy")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Memory kept free on the GPU for activations, the codec stage and graph pools.
_GPU_RESERVE_BYTES = 3 << 30
# Without a GPU the KV cache gets at most this much host memory unless num_gpu_blocks says otherwise.
_CPU_KV_BUDGET_BYTES = 2 << 30


@dataclass(frozen=True)
class RuntimeOptions:
    """Per-process choices outside the deploy profile (CLI flags)."""

    load_format: str = "auto"
    device: str | None = None  # None: cuda when available
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on CPU
    max_waiting: int = 256
    # on_progress(done, total, label) during the weight load and the graph capture
    # (higgs_serve/progress.py); None: silent
    on_progress: ProgressCallback | None = field(default=None, compare=False, repr=False)

    def resolve_device(self, deploy: DeployConfig | None = None) -> torch.device:
        if self.device is None:
            if deploy is not None:
                return torch.device(deploy.stage0.device)
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device}: CUDA is not available on this machine")
        if self.device not in ("cpu",) and not self.device.startswith("cuda"):
            raise ConfigError(f"--device must be cpu or cuda[:N], got {self.device!r}")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        name = self.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        if name not in DTYPES:
            raise ConfigError(f"--dtype must be one of {sorted(DTYPES)}, got {name!r}")
        return DTYPES[name]


@dataclass
class LoadedModel:
    model_dir: Path
    spec: ModelSpec
    prompts: PromptBuilder
    talker: Talker
    codec: CodecDecoder
    device: torch.device
    dtype: torch.dtype
    # Voice cloning: the codec's encoder-side tensors (HuBERT, semantic/acoustic encoders, fc, RVQ),
    # kept on the host so `load_reference_encoder` can build the encoder without re-reading the
    # checkpoint (with --load-format dummy: the same dummy tensors the decoder got).
    codec_encoder_tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    # --load-format dummy: random weights of the real geometry for every network, the
    # watermark's included (benchmarks: the same cost, no weights to carry)
    dummy_weights: bool = False


def load_model(model: str, options: RuntimeOptions, deploy: DeployConfig | None = None) -> LoadedModel:
    """Load the talker on the Stage 0 device and the codec on the Stage 1 device (the deploy
    profile's `devices` and Stage 1 `dtype`; an explicit --device wins for both stages)."""
    if options.load_format not in LOAD_FORMATS:
        raise ConfigError(f"--load-format must be one of {LOAD_FORMATS}, got {options.load_format!r}")
    device = options.resolve_device(deploy)
    dtype = options.resolve_dtype(device)
    codec_device = device if deploy is None or options.device is not None else torch.device(deploy.stage1.device)
    codec_precision = deploy.stage1.dtype if deploy is not None else "float32"
    codec_dtype = PRECISION_DTYPES[codec_precision]
    t0 = time.perf_counter()
    model_dir = resolve_model_dir(model)
    spec = load_model_spec(model_dir)
    prompts = PromptBuilder.from_dir(model_dir)
    if options.load_format == "dummy":
        talker_tensors, codec_tensors = build_dummy_tensors(spec, dtype=dtype, device=device, seed=0,
                                                            on_progress=options.on_progress)
    else:
        ckpt = load_checkpoint(model_dir, spec, on_progress=options.on_progress)
        talker_tensors, codec_tensors = ckpt.talker, ckpt.codec
    talker = Talker(spec.text, spec.audio, dtype=dtype, device=device)
    talker.load_talker_weights(cast_tensors(talker_tensors, dtype, device))
    del talker_tensors
    if codec_device.type == "cuda":
        # cuDNN's TF32 convolutions move the float32 codec output by ~2e-3 of peak (measured on
        # the H200, benchmarks/codec/bench_codec.py); the codec's float32 contract (docs/model.md#codec-geometry) wants
        # real float32 unless the profile asks for tf32. The talker has no convolutions.
        torch.backends.cudnn.allow_tf32 = codec_precision == "tf32"
    codec = CodecDecoder(spec.codec).to(device=codec_device, dtype=codec_dtype)
    codec.load_state(cast_tensors(codec_tensors, codec_dtype, codec_device))
    codec.use_precision(codec_precision)  # after the load: bf16x3 splits the loaded weights, once
    codec.eval()
    encoder_tensors = {name: codec_tensors[name].cpu() for name in expected_encoder_tensors(spec.codec)}
    logger.info("loaded %s (%s, %s, %s) in %.1f s", model, options.load_format, device, dtype, time.perf_counter() - t0)
    return LoadedModel(model_dir, spec, prompts, talker, codec, device, dtype, encoder_tensors,
                       dummy_weights=options.load_format == "dummy")


def load_reference_encoder(loaded: LoadedModel, device: torch.device | None = None) -> CodecEncoder:
    """The codec encoder for voice cloning (docs/model.md#reference-encoder), float32 on `device`
    (default: the model's)."""
    encoder = CodecEncoder(loaded.spec.codec).to(device=device or loaded.device, dtype=torch.float32)
    encoder.load_state(loaded.codec_encoder_tensors)
    return encoder.eval()


def _log_window_against_receptive_field(window: WindowParams, field: tuple[int, int]) -> None:
    """Say what the streaming window costs or loses against the decoder's receptive field
    (docs/model.md#receptive-field-and-seams: the seam error's cause)."""
    left, right = field
    if window.left_context_frames > left:
        logger.info("codec_left_context_frames %d: the decoder sees %d frames back, so %d frames per chunk are "
                    "decoded and cut without changing the audio", window.left_context_frames, left,
                    window.left_context_frames - left)
    elif window.left_context_frames < left:
        logger.info("codec_left_context_frames %d: the decoder sees %d frames back, so the first %d frames after "
                    "each seam differ slightly from a one-shot decode", window.left_context_frames, left,
                    left - window.left_context_frames)
    if window.right_holdback_frames < right:
        logger.info("codec_right_holdback_frames %d: the decoder sees %d frames ahead, so the last %d frames "
                    "before each seam differ slightly from a one-shot decode", window.right_holdback_frames,
                    right, right - window.right_holdback_frames)


def kv_bytes_per_block(spec: ModelSpec, block_size: int, cache_dtype: torch.dtype) -> int:
    """Bytes of one KV block in every layer, stored in `cache_dtype` (the resolved kv_cache_dtype)."""
    return block_size * kv_bytes_per_token(spec.text, cache_dtype)


def kv_budget_bytes(total: int, free: int, own: int, fraction: float, reserve: int) -> int:
    """Bytes this engine may give its KV cache on a GPU of `total` bytes with `free` unused.

    gpu_memory_utilization is this instance's share of the device, as in vLLM: the KV cache gets
    `fraction x total` minus what this process already holds (`own`: weights, codec, graph pools)
    minus the activation reserve. Memory of other processes on the device does not count against
    the fraction, so engines sharing a GPU by fractions (0.45 + 0.45) each get their share; the
    budget still never exceeds what is actually free (less the reserve).
    """
    share = int(total * fraction) - own - reserve
    return min(share, free - reserve)


def size_kv_cache(loaded: LoadedModel, deploy: DeployConfig) -> KVCacheSpec:
    s0 = deploy.stage0
    block_size = s0.kv_block_size
    cache_dtype = resolve_kv_cache_dtype(s0.kv_cache_dtype, loaded.dtype)
    if s0.num_gpu_blocks is not None:
        return KVCacheSpec(num_blocks=s0.num_gpu_blocks, block_size=block_size, dtype=cache_dtype)
    per_block = kv_bytes_per_block(loaded.spec, block_size, cache_dtype)  # fp8: half of bf16's
    blocks_per_seq = -(-s0.max_model_len // block_size)
    # enough for every sequence at full length (+ the null block); more only helps the prefix cache
    useful = s0.max_num_seqs * blocks_per_seq + 1
    if loaded.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(loaded.device)
        budget = kv_budget_bytes(total, free, torch.cuda.memory_reserved(loaded.device),
                                 s0.gpu_memory_utilization, _GPU_RESERVE_BYTES)
    else:
        budget = _CPU_KV_BUDGET_BYTES
    num_blocks = min(useful, budget // per_block)
    if num_blocks < blocks_per_seq:
        raise ConfigError(
            f"gpu_memory_utilization={s0.gpu_memory_utilization} leaves room for {max(num_blocks, 0)} KV blocks "
            f"of {block_size} tokens, fewer than one max_model_len={s0.max_model_len} sequence needs; "
            "raise gpu_memory_utilization or lower max_model_len"
        )
    return KVCacheSpec(num_blocks=int(num_blocks), block_size=block_size, dtype=cache_dtype)


def graph_dispatcher(deploy: DeployConfig, device: torch.device) -> CudaGraphDispatcher:
    """The deploy profile's CUDA graphs on this device (graph modes need CUDA)."""
    return CudaGraphDispatcher.from_config(deploy.stage0, device.type == "cuda")


def build_engine_core(loaded: LoadedModel, deploy: DeployConfig, options: RuntimeOptions,
                      hooks: EngineHooks | None = None) -> EngineCore:
    """A ready `EngineCore` (not started): its parts built, warmed up and captured, with `hooks`
    (metrics, profiling; engine/core.py says when each is called). `options.on_progress(done,
    total, label)` follows Stage 0's graph capture too, called after each captured size."""
    parts = build_engine_parts(loaded, deploy, options.on_progress)
    return EngineCore(parts, max_waiting=options.max_waiting, hooks=hooks)


def build_engine_parts(loaded: LoadedModel, deploy: DeployConfig,
                       on_progress: ProgressCallback | None = None) -> EngineParts:
    """Stage 0 (runner, graphs captured), Stage 1 (codec, warmed up), the scheduler, and the
    input and output processing around them."""
    s0 = deploy.stage0
    kv = size_kv_cache(loaded, deploy)
    backend = get_backend("triton" if loaded.device.type == "cuda" else "torch")
    runner = ModelRunner(
        talker=loaded.talker,
        backend=backend,
        kv=kv,
        max_num_seqs=s0.max_num_seqs,
        max_num_batched_tokens=s0.max_num_batched_tokens,
        max_model_len=s0.max_model_len,
        device=loaded.device,
        dtype=loaded.dtype,
        graphs=graph_dispatcher(deploy, loaded.device),
    )
    runner.capture_graphs(on_progress)
    codec_device = next(loaded.codec.parameters()).device
    codec_path, codec_reason = resolve_codec_graph_path(deploy.stage1, codec_device.type == "cuda")
    logger.info("codec graph path %s: %s", codec_path.value, codec_reason)
    codec = CodecRunner(
        loaded.codec,
        device=codec_device,
        # A CPU convolution rounds differently with the batch size, and batching buys nothing on
        # CPU: decode windows one by one there so a seed gives bit-identical audio.
        max_batch_windows=deploy.stage1.max_batch_windows if codec_device.type == "cuda" else 1,
        samples_per_frame=loaded.spec.codec.hop_length,
        cuda_graphs=codec_path is CodecGraphPath.CUDA_GRAPHS,
    )
    window = WindowParams.from_config(deploy.streaming)
    field = receptive_field_frames(loaded.spec.codec)
    _log_window_against_receptive_field(window, field)
    file_window = file_window_params(window, field)
    # Stage 1's graphs are captured here, on this thread, after Stage 0's (capture_graphs above):
    # two captures must never run at once, and the codec thread starts only with the engine.
    # the deadline policy may start a stream with a larger first chunk (one shape more each)
    ramp = first_chunk_shapes(window) if s0.deadlines.enabled and s0.deadlines.first_chunk_follows_load else ()
    codec.warm_up(tuple(sorted({*warm_window_shapes(window), *warm_window_shapes(file_window), *ramp})),
                  loaded.spec.audio.num_codebooks)
    marks = build_mark_stage(deploy, codec_device, codec_path is CodecGraphPath.CUDA_GRAPHS, loaded.dummy_weights,
                             max(max_chunk_frames(window), max_chunk_frames(file_window)) * SAMPLES_PER_FRAME)
    stage1 = stage1_load(codec, marks, loaded.spec.codec.frame_rate)
    # on the CPU a step computes inside `launch`: the time between two collects is the next plan's
    policy = SlackPolicy(s0.deadlines, s0.max_num_seqs, stage1, synchronous_steps=loaded.device.type != "cuda")
    if s0.deadlines.enabled:
        policy.seed(time_for_deadlines(runner, codec, marks, window, s0.decode_capture_sizes, loaded.spec))
    scheduler = Scheduler(
        max_num_seqs=s0.max_num_seqs,
        max_num_batched_tokens=s0.max_num_batched_tokens,
        max_model_len=s0.max_model_len,
        kv=KVCacheManager(kv.num_blocks, kv.block_size, s0.enable_prefix_caching),
        enable_prefix_caching=s0.enable_prefix_caching,
        policy=policy,
    )
    logger.info("KV cache: %d blocks of %d tokens, %s (%.2f GB)", kv.num_blocks, kv.block_size, kv.dtype,
                kv.num_blocks * kv_bytes_per_block(loaded.spec, kv.block_size, kv.dtype) / 1e9)
    audio = loaded.spec.audio
    inputs = InputProcessor(prompts=loaded.prompts, max_model_len=s0.max_model_len,
                            frame_rate=loaded.spec.codec.frame_rate, num_codebooks=audio.num_codebooks,
                            codebook_size=audio.codebook_size, sample_rate_hz=loaded.spec.codec.sample_rate)
    outputs = OutputProcessor(codec, window, file_window, deploy.async_chunk, audio.num_codebooks,
                              audio.codebook_size, sink_wrapper=marks.wrap if marks is not None else None,
                              stream_window=policy.stream_window, stage1=stage1, on_lead=policy.observe_lead)
    return EngineParts(scheduler=scheduler, runner=runner, codec=codec, inputs=inputs, outputs=outputs,
                       marks=marks)


def time_for_deadlines(runner: ModelRunner, codec: CodecRunner, marks: MarkStage | None, window: WindowParams,
                       sizes: tuple[int, ...], spec: ModelSpec) -> StartupTimings:
    """What the deadline policy starts from (engine/deadlines/startup_timings.py), timed now,
    after every warm-up and capture: a decode step at each capture size and at max_num_seqs
    (worker/step_timing.py), a prompt token, and a call of 1 to `max_batch_windows` steady
    windows of the codec and of the mark stage."""
    t0 = time.perf_counter()
    decode = time_decode_steps(runner, (*sizes, runner.max_num_seqs))
    token = time_prompt_token(runner, decode[min(decode)])
    frames = window.left_context_frames + window.chunk_frames + window.right_holdback_frames
    steady = WindowShape(frames, window.left_context_frames, window.left_context_frames + window.chunk_frames)
    audio_s = window.chunk_frames / spec.codec.frame_rate  # per window
    batches = graph_batch_sizes(codec.max_batch_windows)
    curves = [codec.time_batches(steady, batches, spec.audio.num_codebooks)]
    if marks is not None:
        curves.append(marks.time_batches(window.chunk_frames * spec.codec.hop_length, batches))
    ppm = tuple({b: int(seconds / (b * audio_s) * 1e6) for b, seconds in curve.items()} for curve in curves)
    timings = StartupTimings(decode, token, ppm)
    logger.info("timed for the deadline policy in %.1f s: %s", time.perf_counter() - t0, timings.summary())
    return timings


def stage1_load(codec: CodecRunner, marks: MarkStage | None, frame_rate: int) -> Stage1Load:
    """Stage 1's measured load (engine/deadlines/stage1_load.py): the codec's and the mark
    stage's busy seconds per second of audio each handled."""
    threads = [lambda: (codec.counters.busy_s, codec.counters.frames / frame_rate)]
    if marks is not None:
        threads.append(lambda: (marks.counters.busy_s, marks.counters.audio_s))
    return Stage1Load(threads)


def build_mark_stage(deploy: DeployConfig, device: torch.device, cuda_graphs: bool, dummy_weights: bool,
                     max_chunk_samples: int) -> MarkStage | None:
    """The watermark stage on the codec's device when the deploy config marks audio (raises
    WatermarkUnavailableError when it cannot), else None, said once in the log. With
    `cuda_graphs` (the codec's graph path), its batches of chunks up to `max_chunk_samples` are
    captured here, on this thread, after the codec's (one capture at a time)."""
    if not deploy.watermark:
        logger.warning("watermark off: generated audio is not marked as AI-generated "
                       "(turn it on with --watermark on or `watermark: true` in the deploy config)")
        return None
    watermark = load_watermarker("perth", str(device), dummy=dummy_weights)
    logger.info("watermark on: every generated signal is marked (%s, on %s%s)", watermark.name, device,
                ", random weights: --load-format dummy" if dummy_weights else "")
    # one call marks at most as many windows as the codec decodes at once. On CPU one window a
    # call: the CPU marks a call's windows one after another anyway (audio/perth/runner.py), so
    # a first chunk would only wait for the others
    batch = deploy.stage1.max_batch_windows if device.type == "cuda" else 1
    if cuda_graphs and device.type == "cuda":
        watermark.prepare(batch, max_chunk_samples)
    return MarkStage(watermark, max_batch_windows=batch)
