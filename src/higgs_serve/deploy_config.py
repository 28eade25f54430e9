"""Deploy profiles: YAML → frozen, validated `DeployConfig` (SPEC §2.1).

Finding the YAML, its `base_config` chain, `--stage-overrides`, CLI flags and their precedence
live in `deploy_layers`; this module turns the merged result into typed, validated objects (read
with `deploy_reader`). A key left out of every layer takes the dataclass default below.

YAML shape (names follow vllm-omni's deploy YAML):

    base_config: other.yaml          # optional; relative to this file, else a shipped profile
    async_chunk: true                # stream codes to Stage 1 while Stage 0 generates
    connectors:
      talker_to_codec:               # the one connector: Stage 0 codes → Stage 1 codec
        extra: {codec_chunk_frames, codec_left_context_frames,
                codec_right_holdback_frames, initial_codec_chunk_frames}   # SPEC §1.9
    stages:
      - stage_id: 0                  # talker: see TalkerStageConfig
      - stage_id: 1                  # codec: see CodecStageConfig

Every key is read into a typed field below; anything else is an error. A bad key, type, range
or combination raises `ConfigError` whose message starts with the file (or override) that set
the value, then the key path, e.g.
`deploy/x.yaml: stages[0].compilation_config.cudagraph_capture_sizes: 32 is above ...`.

Stage 0 graph paths (`GraphPath`, resolved by `resolve_graph_path`):
  * MLP_GRAPHS (`enforce_eager: true`, `cudagraph_mode: LOCAL_MLP`, the default for eager):
    attention runs eagerly; each decoder layer's post-attention RMSNorm + MLP replays a CUDA
    graph, captured at start-up (never lazily on live traffic) for `cudagraph_capture_sizes`.
  * FULL_DECODE_GRAPH (`enforce_eager: false`, `cudagraph_mode: FULL_DECODE_ONLY`, the default
    when not eager): a decode-only step replays one whole-step CUDA graph; MLP graphs are off.
  * PIECEWISE_GRAPHS (`enforce_eager: true`, `cudagraph_mode: PIECEWISE`, an option beyond the
    two profiles): attention kernels run eagerly, everything else of a step (prefill, mixed or
    decode) replays per padded token count; `cudagraph_capture_sizes` are token counts and may
    exceed max_num_seqs (up to max_num_batched_tokens).
  * FULL_DECODE_AND_PIECEWISE (`enforce_eager: false`, `cudagraph_mode: FULL_AND_PIECEWISE`):
    decode-only steps replay the full decode graph, every other step the piecewise graphs.
  * EAGER (`cudagraph_mode: NONE`, or no CUDA device): no graphs.
The full decode graph and the local MLP graphs exclude each other; a config asking for both is
an error, never a choice. (The mode names are vLLM's; PIECEWISE is vLLM's piecewise graph.)

Stage 1 (`resolve_codec_graph_path`): `enforce_eager: false` (the default) captures the whole
codec decoder as one CUDA graph per warmed-up (window length, batch size) at start-up; `true`
decodes eagerly. Off CUDA the codec is always eager.

This module is pure Python (no torch): the caller passes `device_count` and `cuda_available`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from higgs_serve.deploy_layers import (
    CODEC_STAGE_ID,
    TALKER_STAGE_ID,
    KeyPath,
    collect_layers,
    merge_layers,
)
from higgs_serve.deploy_reader import ReadContext, Section, key_text
# Re-exported: callers and tests import these from here, the config's public module.
from higgs_serve.deploy_layers import SHIPPED_DIR, list_shipped_profiles  # noqa: F401
from higgs_serve.sampling_params import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    frame_count_problem,
    seed_problem,
    temperature_problem,
    top_k_problem,
    top_p_problem,
)

CONNECTOR_NAME = "talker_to_codec"
MODEL_MAX_LEN = 8192  # the model's training context (SPEC §1)
# "tf32": float32 weights and activations, convolutions on TF32 tensor cores (measured on the
# H200: 2x the float32 throughput at 64 windows, max error 2e-3 of peak; bf16: 3e-2 of peak).
CODEC_DTYPES = ("float32", "tf32", "bfloat16", "float16")
# Stage 0 `kv_cache_dtype` (vLLM's key and values): "auto" stores K/V in the model dtype; "fp8"
# (alias "fp8_e4m3", vLLM's other spelling) stores float8 e4m3 with scale 1.0, half of bf16's
# bytes (worker/attention/kv_cache_dtype.py says why that scale is safe for this model).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
_KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8"}  # one spelling downstream


class CudaGraphMode(enum.Enum):
    """`compilation_config.cudagraph_mode` values."""

    NONE = "NONE"  # no CUDA graphs at all
    LOCAL_MLP = "LOCAL_MLP"  # per-layer post-attention norm + MLP graphs (needs enforce_eager)
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"  # whole decode step as one graph (needs not eager)
    PIECEWISE = "PIECEWISE"  # every step but its attention kernels, per token count (eager attention)
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"  # full decode graph + piecewise for other steps

    @property
    def piecewise(self) -> bool:
        return self in (CudaGraphMode.PIECEWISE, CudaGraphMode.FULL_AND_PIECEWISE)


class CodecGraphPath(enum.Enum):
    """What Stage 1 actually runs, after `enforce_eager` meets the machine."""

    EAGER = "EAGER"
    CUDA_GRAPHS = "CUDA_GRAPHS"  # whole-decoder graphs per warmed (window length, batch size)


class GraphPath(enum.Enum):
    """What Stage 0 actually runs, after the mode meets the machine."""

    EAGER = "EAGER"
    MLP_GRAPHS = "MLP_GRAPHS"
    FULL_DECODE_GRAPH = "FULL_DECODE_GRAPH"
    PIECEWISE_GRAPHS = "PIECEWISE_GRAPHS"
    FULL_DECODE_AND_PIECEWISE = "FULL_DECODE_AND_PIECEWISE"


@dataclass(frozen=True)
class DefaultSamplingParams:
    """Profile defaults a request's own fields override (sampling_params.from_defaults).

    `seed: null` means a random seed per request. A fixed profile seed would make every request
    without its own seed produce identical audio for the same text (vllm-omni ships one; we don't).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_NEW_TOKENS  # frames; also the ceiling for max_new_tokens
    seed: int | None = None


@dataclass(frozen=True)
class CompilationConfig:
    cudagraph_mode: CudaGraphMode = CudaGraphMode.LOCAL_MLP
    # Batch sizes captured at start-up, ascending, each <= max_num_seqs. A batch is padded up to
    # the next size; a batch above the largest runs eagerly. Default: 1, 2, 4, 8, then every 8,
    # then max_num_seqs itself. Piecewise modes: token counts (<= max_num_batched_tokens); the
    # default adds 96, 128, 192, 256, 384, 512 above max_num_seqs for prefill and mixed steps.
    cudagraph_capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    cudagraph_num_of_warmups: int = 1  # eager runs per size before its capture (piecewise: at least 1)


@dataclass(frozen=True)
class TalkerStageConfig:
    """Stage 0 (talker, autoregressive, KV cache)."""

    max_num_seqs: int = 16  # running requests (decode slots)
    gpu_memory_utilization: float = 0.8  # fraction of device memory for weights + KV + work
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 4096  # token budget per step (chunked prefill)
    max_model_len: int = MODEL_MAX_LEN  # prompt + generated rows, <= the training context
    devices: str = "0"  # one CUDA device index, or "cpu"
    kv_block_size: int = 16  # tokens per KV block (power of two)
    # Explicit KV block count, overriding the gpu_memory_utilization sizing (needed on CPU,
    # where there is no device memory to measure). None = size from memory.
    num_gpu_blocks: int | None = None
    # K/V storage: "auto" (the model dtype) or "fp8" (float8 e4m3, the alias already folded in).
    # Any model dtype may take fp8, on CUDA and on CPU; the KV pool sizing uses its 1-byte size.
    kv_cache_dtype: str = "auto"
    default_sampling_params: DefaultSamplingParams = field(default_factory=DefaultSamplingParams)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)

    @property
    def decode_capture_sizes(self) -> tuple[int, ...]:
        """The capture sizes a decode batch can take (piecewise modes also list token counts
        above max_num_seqs, which only the piecewise graphs use)."""
        return tuple(s for s in self.compilation_config.cudagraph_capture_sizes if s <= self.max_num_seqs)

    @property
    def device(self) -> str:
        """A torch device string: "cpu" or "cuda:N"."""
        return _torch_device(self.devices)


@dataclass(frozen=True)
class CodecStageConfig:
    """Stage 1 (codec, no KV cache)."""

    # false: on CUDA, the whole decoder replays a CUDA graph per (window length, batch size) the
    # start-up warm-up decodes (streaming window lengths x 1..max_batch_windows); other shapes
    # run eagerly. true: always eager (saves the graph pool's memory and the capture time).
    enforce_eager: bool = False
    max_batch_windows: int = 64  # most streaming windows decoded in one batched codec call
    devices: str = "0"
    dtype: str = "float32"  # SPEC §1.8: float32 unless bf16 is measured transparent (CODEC_DTYPES)

    @property
    def device(self) -> str:
        return _torch_device(self.devices)


@dataclass(frozen=True)
class StreamingWindowConfig:
    """SPEC §1.9 window rule (`connectors.talker_to_codec.extra`), in frames."""

    codec_chunk_frames: int = 25  # C: steady-state chunk size
    codec_left_context_frames: int = 25  # L: frames re-decoded before a chunk, then cut
    codec_right_holdback_frames: int = 4  # H: frames held back until more arrive
    initial_codec_chunk_frames: int = 1  # I: first chunk size (time to first audio)


@dataclass(frozen=True)
class DeployConfig:
    source: str  # the deploy YAML that was loaded (top of its base_config chain)
    stage0: TalkerStageConfig = field(default_factory=TalkerStageConfig)
    stage1: CodecStageConfig = field(default_factory=CodecStageConfig)
    async_chunk: bool = True  # stream codes to Stage 1 while generating
    streaming: StreamingWindowConfig = field(default_factory=StreamingWindowConfig)
    layers: tuple[str, ...] = ()  # every source merged, lowest precedence first

    def to_dict(self, cuda_available: bool = True) -> dict[str, Any]:
        """The fully resolved config in the YAML's shape, for `config show` (JSON-ready)."""
        path, reason = resolve_graph_path(self.stage0, cuda_available)
        codec_path, codec_reason = resolve_codec_graph_path(self.stage1, cuda_available)
        stage0 = _plain(asdict(self.stage0))
        stage1 = _plain(asdict(self.stage1))
        return {
            "source": self.source,
            "layers": list(self.layers),
            "async_chunk": self.async_chunk,
            "connectors": {CONNECTOR_NAME: {"extra": asdict(self.streaming)}},
            "stages": [
                {"stage_id": TALKER_STAGE_ID, **stage0,
                 "resolved_graph_path": {"path": path.value, "reason": reason}},
                {"stage_id": CODEC_STAGE_ID, **stage1,
                 "resolved_graph_path": {"path": codec_path.value, "reason": codec_reason}},
            ],
        }


def resolve_graph_path(stage0: TalkerStageConfig, cuda_available: bool) -> tuple[GraphPath, str]:
    """The graph path Stage 0 uses on this machine, and why (the caller logs the reason once).

    The config was validated at load, so the mode and enforce_eager never conflict here.
    """
    compilation = stage0.compilation_config
    mode = compilation.cudagraph_mode
    sizes = list(compilation.cudagraph_capture_sizes)
    if mode is CudaGraphMode.NONE:
        return GraphPath.EAGER, "compilation_config.cudagraph_mode is NONE: no CUDA graphs"
    if stage0.devices == "cpu":
        return GraphPath.EAGER, (f"devices is \"cpu\": cudagraph_mode {mode.value} needs a CUDA "
                                 "device, falling back to eager")
    if not cuda_available:
        return GraphPath.EAGER, (f"CUDA is not available: cudagraph_mode {mode.value} falls back "
                                 "to eager")
    if mode is CudaGraphMode.LOCAL_MLP:
        return GraphPath.MLP_GRAPHS, (
            f"enforce_eager: true, cudagraph_mode: LOCAL_MLP: attention runs eagerly; each "
            f"decoder layer's post-attention RMSNorm + MLP replays a CUDA graph captured at "
            f"start-up for batch sizes {sizes}")
    if mode is CudaGraphMode.PIECEWISE:
        return GraphPath.PIECEWISE_GRAPHS, (
            f"enforce_eager: true, cudagraph_mode: PIECEWISE: the attention kernels run eagerly; "
            f"the rest of every step (prefill, mixed, decode) replays CUDA graphs captured at "
            f"start-up for token counts {sizes}")
    if mode is CudaGraphMode.FULL_AND_PIECEWISE:
        return GraphPath.FULL_DECODE_AND_PIECEWISE, (
            f"enforce_eager: false, cudagraph_mode: FULL_AND_PIECEWISE: each decode-only step "
            f"replays one whole-step CUDA graph (batch sizes {list(stage0.decode_capture_sizes)}); "
            f"prefill and mixed steps replay piecewise graphs, attention eager (token counts "
            f"{sizes}); the local MLP graphs are off")
    return GraphPath.FULL_DECODE_GRAPH, (
        f"enforce_eager: false, cudagraph_mode: FULL_DECODE_ONLY: each decode-only step replays "
        f"one whole-step CUDA graph captured at start-up for batch sizes {sizes}; other steps run "
        f"eagerly; the local MLP graphs are off (the two paths are mutually exclusive)")


def resolve_codec_graph_path(stage1: CodecStageConfig, cuda_available: bool) -> tuple[CodecGraphPath, str]:
    """Whether Stage 1 captures CUDA graphs on this machine, and why (logged once at start-up)."""
    if stage1.enforce_eager:
        return CodecGraphPath.EAGER, "enforce_eager: true: the codec decodes eagerly"
    if stage1.devices == "cpu" or not cuda_available:
        where = "devices is \"cpu\"" if stage1.devices == "cpu" else "CUDA is not available"
        return CodecGraphPath.EAGER, f"{where}: the codec decodes eagerly (CUDA graphs need a CUDA device)"
    return CodecGraphPath.CUDA_GRAPHS, (
        "enforce_eager: false: the whole codec decoder replays a CUDA graph per (window length, "
        "batch size) warmed up at start-up (streaming window lengths x batch 1-max_batch_windows); "
        "other shapes decode eagerly")


def load_deploy_config(
    deploy_config: str | None = None,
    model_type: str | None = None,
    stage_overrides: str | dict | None = None,
    cli_overrides: dict | None = None,
    device_count: int | None = None,
) -> DeployConfig:
    """Find, merge and validate a deploy config (precedence: see `deploy_layers`).

    `stage_overrides`: `--stage-overrides` JSON (or its parsed dict), `{"0": {...}, "1": {...}}`.
    `cli_overrides`: the same per-stage shape from explicit CLI flags, plus top-level keys
    (e.g. `{"async_chunk": False}`). `device_count`: CUDA devices on this machine (None skips
    the device check).
    """
    path, layers = collect_layers(deploy_config, model_type, stage_overrides, cli_overrides)
    merged, origins = merge_layers(layers)
    ctx = ReadContext(origins, f"{path} (default value)", device_count)
    return _build(merged, ctx, str(path), tuple(source for source, _ in layers))


def _build(doc: dict, ctx: ReadContext, source: str, layers: tuple[str, ...]) -> DeployConfig:
    root = Section(doc, (), ctx)
    async_chunk = root.boolean("async_chunk", True)
    streaming = _build_streaming(root.section("connectors"))
    stages = root.section("stages")
    stage0 = _build_talker(stages.section(TALKER_STAGE_ID))
    stage1 = _build_codec(stages.section(CODEC_STAGE_ID))
    stages.finish()
    root.finish()
    return DeployConfig(source=source, stage0=stage0, stage1=stage1, async_chunk=async_chunk,
                        streaming=streaming, layers=layers)


def _build_streaming(connectors: Section) -> StreamingWindowConfig:
    connector = connectors.section(CONNECTOR_NAME)
    extra = connector.section("extra")
    config = StreamingWindowConfig(
        codec_chunk_frames=extra.integer("codec_chunk_frames", 25, 1),
        codec_left_context_frames=extra.integer("codec_left_context_frames", 25, 0),
        codec_right_holdback_frames=extra.integer("codec_right_holdback_frames", 4, 0),
        initial_codec_chunk_frames=extra.integer("initial_codec_chunk_frames", 1, 1),
    )
    for section in (extra, connector, connectors):
        section.finish()
    return config


def _build_talker(stage: Section) -> TalkerStageConfig:
    max_num_seqs = stage.integer("max_num_seqs", 16, 1)
    enforce_eager = stage.boolean("enforce_eager", True)
    max_num_batched_tokens = stage.integer("max_num_batched_tokens", 4096, 1)
    if max_num_batched_tokens < max_num_seqs:
        raise stage.ctx.error(
            [stage.key("max_num_batched_tokens"), stage.key("max_num_seqs")],
            f"{max_num_batched_tokens} is below max_num_seqs {max_num_seqs}: a step could not "
            f"hold one decode token per running request")
    kv_block_size = stage.integer("kv_block_size", 16, 1)
    if kv_block_size & (kv_block_size - 1):
        raise stage.error("kv_block_size", f"{kv_block_size} is not a power of two")
    config = TalkerStageConfig(
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=stage.checked("gpu_memory_utilization", 0.8, _fraction_problem),
        enforce_eager=enforce_eager,
        enable_prefix_caching=stage.boolean("enable_prefix_caching", True),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=stage.integer("max_model_len", MODEL_MAX_LEN, 1, MODEL_MAX_LEN),
        devices=_devices(stage),
        kv_block_size=kv_block_size,
        num_gpu_blocks=stage.integer("num_gpu_blocks", None, 1, optional=True),
        kv_cache_dtype=_kv_cache_dtype(stage),
        default_sampling_params=_build_sampling(stage.section("default_sampling_params")),
        compilation_config=_build_compilation(stage, enforce_eager, max_num_seqs, max_num_batched_tokens),
    )
    stage.finish()
    return config


def _fraction_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {type(value).__name__} {value!r}"
    return None if 0 < value <= 1 else f"{value!r} is outside (0, 1]"


def _kv_cache_dtype(stage: Section) -> str:
    name = stage.choice("kv_cache_dtype", "auto", KV_CACHE_DTYPES)
    return _KV_CACHE_DTYPE_ALIASES.get(name, name)


def _devices(stage: Section) -> str:
    value = stage.raw("devices", "0")
    if not isinstance(value, str) or not (value == "cpu" or value.isdigit()):
        hint = " (quote it: \"0\")" if isinstance(value, int) else ""
        raise stage.error("devices", f"expected one CUDA device index as a string (\"0\") or "
                                     f"\"cpu\", got {type(value).__name__} {value!r}{hint}")
    count = stage.ctx.device_count
    if value != "cpu" and count is not None and int(value) >= count:
        fix = f"use an index below {count} or \"cpu\"" if count else "use \"cpu\""
        raise stage.error("devices", f"CUDA device {value} does not exist: this machine has "
                                     f"{count} CUDA device(s); {fix}")
    return value


def _build_sampling(section: Section) -> DefaultSamplingParams:
    config = DefaultSamplingParams(
        temperature=section.checked("temperature", DEFAULT_TEMPERATURE, temperature_problem),
        top_p=section.checked("top_p", DEFAULT_TOP_P, top_p_problem),
        top_k=section.checked("top_k", DEFAULT_TOP_K, top_k_problem),
        max_tokens=section.integer("max_tokens", DEFAULT_MAX_NEW_TOKENS, 1),
        seed=section.checked("seed", None, seed_problem),
    )
    section.finish()
    return config


def _build_compilation(stage: Section, enforce_eager: bool, max_num_seqs: int,
                       max_num_batched_tokens: int) -> CompilationConfig:
    section = stage.section("compilation_config")
    mode_name = section.choice("cudagraph_mode", None, tuple(m.value for m in CudaGraphMode))
    if mode_name is None:  # not given: the graph path that matches enforce_eager
        mode = CudaGraphMode.LOCAL_MLP if enforce_eager else CudaGraphMode.FULL_DECODE_ONLY
    else:
        mode = CudaGraphMode(mode_name)
    _check_one_graph_path(stage, section, enforce_eager, mode)
    if mode.piecewise:
        limit, limit_key = max_num_batched_tokens, stage.key("max_num_batched_tokens")
    else:
        limit, limit_key = max_num_seqs, stage.key("max_num_seqs")
    sizes = _capture_sizes(section, mode, max_num_seqs, limit, limit_key)
    config = CompilationConfig(
        cudagraph_mode=mode,
        cudagraph_capture_sizes=sizes,
        cudagraph_num_of_warmups=section.integer("cudagraph_num_of_warmups", 1, 0),
    )
    section.finish()
    return config


def _check_one_graph_path(stage: Section, section: Section, enforce_eager: bool,
                          mode: CudaGraphMode) -> None:
    mode_key, eager_key = section.key("cudagraph_mode"), stage.key("enforce_eager")
    eager = key_text(eager_key)
    full = (CudaGraphMode.FULL_DECODE_ONLY, CudaGraphMode.FULL_AND_PIECEWISE)
    if enforce_eager and mode in full:
        problem = (f"{mode.value} (the whole-step decode graph) with {eager}: true (the "
                   f"local MLP graph path) asks for both graph paths, which exclude each other: "
                   f"set enforce_eager: false for the full decode graph, or drop cudagraph_mode")
    elif not enforce_eager and mode is CudaGraphMode.PIECEWISE:
        problem = (f"PIECEWISE (eager attention kernels) with {eager}: false (the whole-step "
                   f"decode graph path): set enforce_eager: true, or cudagraph_mode: "
                   f"FULL_AND_PIECEWISE for the full decode graph plus piecewise graphs")
    elif not enforce_eager and mode is CudaGraphMode.LOCAL_MLP:
        problem = (f"LOCAL_MLP (the local MLP graphs) with {eager}: false (the whole-step decode "
                   f"graph path) asks for both graph paths, which exclude each other: set "
                   f"enforce_eager: true for the MLP graphs, or cudagraph_mode: FULL_DECODE_ONLY")
    else:
        return
    raise stage.ctx.error([mode_key, eager_key], problem)


def _capture_sizes(section: Section, mode: CudaGraphMode, max_num_seqs: int, limit: int,
                   limit_key: KeyPath) -> tuple[int, ...]:
    """Ascending sizes, each <= `limit` (max_num_seqs, or the token budget in piecewise modes)."""
    name = "cudagraph_capture_sizes"
    value = section.raw(name, None)
    if value is None:
        return _default_capture_sizes(max_num_seqs, limit if mode.piecewise else max_num_seqs)
    if not isinstance(value, list):
        raise section.error(name, f"expected a list of batch sizes, got {type(value).__name__}")
    for size in value:
        problem = frame_count_problem(size, 1)  # a positive integer
        if problem is not None:
            raise section.error(name, f"batch size {problem}")
        if size > limit:
            limit_name = limit_key[-1]
            raise section.ctx.error(
                [section.key(name), limit_key],
                f"{size} is above {limit_name} {limit}: no "
                f"{'step' if mode.piecewise else 'batch'} can be that large; drop it or raise "
                f"{limit_name}")
    if len(set(value)) != len(value):
        raise section.error(name, f"{value} lists a size twice")
    if not value and mode is not CudaGraphMode.NONE:
        raise section.error(name, f"is empty, but cudagraph_mode {mode.value} needs at least "
                                  f"one size (or set cudagraph_mode: NONE)")
    return tuple(sorted(value))


PIECEWISE_TOKEN_SIZES = (96, 128, 192, 256, 384, 512)


def _default_capture_sizes(max_num_seqs: int, max_tokens: int) -> tuple[int, ...]:
    """Decode batch sizes up to max_num_seqs; piecewise modes (max_tokens > max_num_seqs) add
    token counts for prefill and mixed steps."""
    sizes = {1, 2, 4, 8, *range(16, max_num_seqs + 1, 8), max_num_seqs}
    sizes = {s for s in sizes if s <= max_num_seqs}
    sizes |= {s for s in PIECEWISE_TOKEN_SIZES if max_num_seqs < s <= max_tokens}
    return tuple(sorted(sizes))


def _build_codec(stage: Section) -> CodecStageConfig:
    config = CodecStageConfig(
        enforce_eager=stage.boolean("enforce_eager", False),
        max_batch_windows=stage.integer("max_batch_windows", 64, 1),
        devices=_devices(stage),
        dtype=stage.choice("dtype", "float32", CODEC_DTYPES),
    )
    stage.finish()
    return config


def _torch_device(devices: str) -> str:
    return "cpu" if devices == "cpu" else f"cuda:{devices}"


def _plain(value: Any) -> Any:
    """asdict output → JSON-ready (enums to their names, tuples to lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value
