"""Deploy profiles: YAML → frozen, validated `DeployConfig` (docs/model.md#deploy-profiles).

Finding the YAML, its `base_config` chain, `--stage-overrides`, CLI flags and their precedence
live in `config.layers`; `config.loader.load_deploy_config` reads the merged result (with
`config.reader`) into the typed objects defined here. A key left out of every layer takes the
dataclass default below.

YAML shape (names follow vllm-omni's deploy YAML):

    base_config: other.yaml          # optional; relative to this file, else a shipped profile
    async_chunk: true                # stream codes to Stage 1 while Stage 0 generates
    watermark: true                  # mark every generated signal (docs/model.md#watermark)
    connectors:
      talker_to_codec:               # the one connector: Stage 0 codes → Stage 1 codec
        extra: {codec_chunk_frames, codec_left_context_frames,
                codec_right_holdback_frames, initial_codec_chunk_frames,   # docs/model.md#streaming-windows
                codec_chunk_doubling}                                      # codec/chunker.py
    stages:
      - stage_id: 0                  # talker: see TalkerStageConfig
      - stage_id: 1                  # codec: see CodecStageConfig

Every key is read into a typed field below; anything else is an error. A bad key, type, range
or combination raises `ConfigError` whose message starts with the file (or override) that set
the value, then the key path, e.g.
`profiles/x.yaml: stages[0].compilation_config.cudagraph_capture_sizes: 32 is above ...`.

Stage 0 graph modes (`CudaGraphMode`, resolved on the machine by `resolve_graph_mode`):
  * LOCAL_MLP (`enforce_eager: true`, the default for eager): attention runs eagerly; each
    decoder layer's post-attention RMSNorm + MLP replays a CUDA graph, captured at start-up
    (never lazily on live traffic) for `cudagraph_capture_sizes`.
  * FULL_DECODE_ONLY (`enforce_eager: false`, the default when not eager): a decode-only step
    replays one whole-step CUDA graph; MLP graphs are off.
  * PIECEWISE (`enforce_eager: true`, an option beyond the two profiles): attention kernels run
    eagerly, everything else of a step (prefill, mixed or decode) replays per padded token
    count; `cudagraph_capture_sizes` are token counts and may exceed max_num_seqs (up to
    max_num_batched_tokens).
  * FULL_AND_PIECEWISE (`enforce_eager: false`): decode-only steps replay the full decode
    graph, every other step the piecewise graphs.
  * NONE (asked for, or no CUDA device): no graphs.
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

from higgs_serve.config.layers import CODEC_STAGE_ID, TALKER_STAGE_ID
# Re-exported: DefaultSamplingParams is a field of TalkerStageConfig (defined beside the
# request-side defaults so `sampling_params` and this module never import each other).
from higgs_serve.config.sampling_defaults import DefaultSamplingParams

CONNECTOR_NAME = "talker_to_codec"
MODEL_MAX_LEN = 8192  # the model's training context (docs/model.md)
# "tf32": float32 weights and activations, convolutions on TF32 tensor cores (measured on the
# H200: 2x the float32 throughput at 64 windows, max error 2e-3 of peak; bf16: 3e-2 of peak).
# "bf16x3": float32 weights and activations, the residual units' convolutions as three bf16
# tensor-core products summed in float32 (codec/split_conv.py; ~1e-5 of peak).
CODEC_DTYPES = ("float32", "bf16x3", "tf32", "bfloat16", "float16")
# Stage 0 `kv_cache_dtype` (vLLM's key and values): "auto" stores K/V in the model dtype; "fp8"
# (alias "fp8_e4m3", vLLM's other spelling) stores float8 e4m3 with scale 1.0, half of bf16's
# bytes (worker/attention/kv_cache_dtype.py says why that scale is safe for this model).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8"}  # one spelling downstream


class CudaGraphMode(enum.Enum):
    """Stage 0's CUDA-graph mode, the one type for config, resolution and dispatch (vLLM's
    `CUDAGraphMode` shape). A configured mode (`compilation_config.cudagraph_mode`) pairs the
    mode of decode-only steps (`decode_mode`) with the mode of every other step (`mixed_mode`);
    each step runs in one of NONE, PIECEWISE, FULL or LOCAL_MLP (worker/cuda_graphs.py picks it).
    """

    NONE = "NONE"  # no CUDA graphs at all
    LOCAL_MLP = "LOCAL_MLP"  # per-layer post-attention norm + MLP graphs (needs enforce_eager)
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"  # whole decode step as one graph (needs not eager)
    PIECEWISE = "PIECEWISE"  # every step but its attention kernels, per token count (eager attention)
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"  # full decode graph + piecewise for other steps
    FULL = "FULL"  # a step's mode only: the whole decode step as one graph (not a config value)

    @property
    def decode_mode(self) -> CudaGraphMode:
        """The mode a decode-only step runs in."""
        return _DECODE_MODE[self]

    @property
    def mixed_mode(self) -> CudaGraphMode:
        """The mode any other step (prefill, mixed) runs in."""
        return _MIXED_MODE[self]

    @property
    def piecewise(self) -> bool:
        """Some steps replay piecewise graphs: the capture sizes are token counts."""
        return CudaGraphMode.PIECEWISE in (self.decode_mode, self.mixed_mode)

    @classmethod
    def config_values(cls) -> tuple[str, ...]:
        """What `cudagraph_mode` accepts: every mode but FULL (no full graphs of mixed steps)."""
        return tuple(m.value for m in cls if m is not cls.FULL)


_M = CudaGraphMode
_DECODE_MODE = {_M.NONE: _M.NONE, _M.PIECEWISE: _M.PIECEWISE, _M.FULL: _M.FULL, _M.FULL_DECODE_ONLY: _M.FULL,
                _M.FULL_AND_PIECEWISE: _M.FULL, _M.LOCAL_MLP: _M.LOCAL_MLP}
_MIXED_MODE = {_M.NONE: _M.NONE, _M.PIECEWISE: _M.PIECEWISE, _M.FULL: _M.FULL, _M.FULL_DECODE_ONLY: _M.NONE,
               _M.FULL_AND_PIECEWISE: _M.PIECEWISE, _M.LOCAL_MLP: _M.NONE}


class CodecGraphPath(enum.Enum):
    """What Stage 1 actually runs, after `enforce_eager` meets the machine."""

    EAGER = "EAGER"
    CUDA_GRAPHS = "CUDA_GRAPHS"  # whole-decoder graphs per warmed (window length, batch size)


DEFAULT_MAX_NUM_SEQS = 16  # running requests (decode slots); the capture sizes default from it
PIECEWISE_TOKEN_SIZES = (96, 128, 192, 256, 384, 512)


def default_capture_sizes(max_num_seqs: int, max_tokens: int) -> tuple[int, ...]:
    """Decode batch sizes up to max_num_seqs; piecewise modes (max_tokens > max_num_seqs) add
    token counts for prefill and mixed steps."""
    sizes = {1, 2, 4, 8, *range(16, max_num_seqs + 1, 8), max_num_seqs}
    sizes = {s for s in sizes if s <= max_num_seqs}
    sizes |= {s for s in PIECEWISE_TOKEN_SIZES if max_num_seqs < s <= max_tokens}
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class CompilationConfig:
    cudagraph_mode: CudaGraphMode = CudaGraphMode.LOCAL_MLP
    # Batch sizes captured at start-up, ascending, each <= max_num_seqs. A batch is padded up to
    # the next size; a batch above the largest runs eagerly. Default: 1, 2, 4, 8, then every 8,
    # then max_num_seqs itself. Piecewise modes: token counts (<= max_num_batched_tokens); the
    # default adds 96, 128, 192, 256, 384, 512 above max_num_seqs for prefill and mixed steps.
    cudagraph_capture_sizes: tuple[int, ...] = default_capture_sizes(DEFAULT_MAX_NUM_SEQS, DEFAULT_MAX_NUM_SEQS)
    cudagraph_num_of_warmups: int = 1  # eager runs per size before its capture (piecewise: at least 1)


@dataclass(frozen=True)
class DeadlineConfig:
    """Stage 0's deadline policy for streamed audio (`stages[0].deadlines`; engine/deadlines/,
    docs/architecture.md#deadlines). Every value here may need tuning per GPU; each is
    measured against in docs/performance.md."""

    # false: first come first served, every running request in every step, no admission by
    # real-time capacity, the profile's fixed first chunk (the policy before issue 53)
    enabled: bool = True
    # share of real time kept spare: a stream is admitted while Stage 0's predicted step and
    # each Stage 1 thread's cost leave this much of each frame period (40 ms at 1x) free
    realtime_headroom: float = 0.1
    # a stream with more slack than this may sit out a step when Stage 0 cannot run every decode
    # within the real-time step (its audio keeps playing meanwhile)
    park_slack_ms: int = 1000
    # a new stream's first audio is scheduled against its arrival plus this (ordering only;
    # the server's --ttfa-budget-s refuses what would be later than its budget)
    first_audio_target_ms: int = 500
    # prompt tokens a step always gets, however tight the streams' slack (prefill never stops).
    # Streams in their first-chunk ramp run with little slack by design, so a burst's prompts
    # get this floor: at 64 tokens a burst of 64 streams took 1.35 s to its first audio on an
    # H100 (0.48 s with the policy off); 512 tokens add ~16 ms to a step there
    min_prefill_chunk_tokens: int = 512
    # the floor under the low tail (1st percentile over the last second) of the leads streams'
    # steady chunks leave with: below it, with a listener losing ground, the stream limit backs
    # off; at or above it the limit may grow while streams wait (engine/deadlines/stream_limit.py).
    # Negative: a listener may wait this long for a chunk before it counts against the load (100 ms
    # is a stall; on an H100 at its best load 1 % of steady chunks come a few tens of ms late)
    lead_margin_ms: int = -50
    # the first chunk (and so the doubling ramp) grows when steps are slow or Stage 1 is slow:
    # the smallest first chunk whose ramp keeps ahead of the player (codec/chunker.py)
    first_chunk_follows_load: bool = True


@dataclass(frozen=True)
class TalkerStageConfig:
    """Stage 0 (talker, autoregressive, KV cache)."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # running requests (decode slots)
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
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)

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
    # docs/model.md#codec-geometry: float32 unless another precision is measured transparent
    dtype: str = "float32"  # one of CODEC_DTYPES

    @property
    def device(self) -> str:
        return _torch_device(self.devices)


@dataclass(frozen=True)
class StreamingWindowConfig:
    """The streaming window rule (docs/model.md#streaming-windows; `connectors.talker_to_codec.extra`), in frames."""

    codec_chunk_frames: int = 25  # C: steady-state chunk size
    codec_left_context_frames: int = 25  # L: frames re-decoded before a chunk, then cut
    codec_right_holdback_frames: int = 4  # H: frames held back until more arrive
    initial_codec_chunk_frames: int = 1  # I: first chunk size (time to first audio)
    # later chunks as long as all audio sent before them, up to C: no stream runs dry at start
    # (false: the plain window rule (docs/model.md#chunk-doubling), C after the first chunk; see codec/chunker.py)
    codec_chunk_doubling: bool = True


@dataclass(frozen=True)
class DeployConfig:
    source: str  # the deploy YAML that was loaded (top of its base_config chain)
    stage0: TalkerStageConfig = field(default_factory=TalkerStageConfig)
    stage1: CodecStageConfig = field(default_factory=CodecStageConfig)
    async_chunk: bool = True  # stream codes to Stage 1 while generating
    # Mark every generated signal with the PerTh watermark on Stage 1's device (engine/mark_stage.py;
    # docs/model.md#watermark says why it is on by default). false: audio leaves unmarked.
    watermark: bool = True
    streaming: StreamingWindowConfig = field(default_factory=StreamingWindowConfig)
    layers: tuple[str, ...] = ()  # every source merged, lowest precedence first

    def to_dict(self, cuda_available: bool = True) -> dict[str, Any]:
        """The fully resolved config in the YAML's shape, for `config show` (JSON-ready)."""
        mode, reason = resolve_graph_mode(self.stage0, cuda_available)
        codec_path, codec_reason = resolve_codec_graph_path(self.stage1, cuda_available)
        stage0 = _plain(asdict(self.stage0))
        stage1 = _plain(asdict(self.stage1))
        return {
            "source": self.source,
            "layers": list(self.layers),
            "async_chunk": self.async_chunk,
            "watermark": self.watermark,
            "connectors": {CONNECTOR_NAME: {"extra": asdict(self.streaming)}},
            "stages": [
                {"stage_id": TALKER_STAGE_ID, **stage0,
                 "resolved_graph_path": {"path": mode.value, "reason": reason}},
                {"stage_id": CODEC_STAGE_ID, **stage1,
                 "resolved_graph_path": {"path": codec_path.value, "reason": codec_reason}},
            ],
        }


def resolve_graph_mode(stage0: TalkerStageConfig, cuda_available: bool) -> tuple[CudaGraphMode, str]:
    """The graph mode Stage 0 uses on this machine (NONE off CUDA), and why (the caller logs the
    reason once).

    The config was validated at load, so the mode and enforce_eager never conflict here.
    """
    compilation = stage0.compilation_config
    mode = compilation.cudagraph_mode
    sizes = list(compilation.cudagraph_capture_sizes)
    if mode is CudaGraphMode.NONE:
        return CudaGraphMode.NONE, "compilation_config.cudagraph_mode is NONE: no CUDA graphs"
    if stage0.devices == "cpu":
        return CudaGraphMode.NONE, (f"devices is \"cpu\": cudagraph_mode {mode.value} needs a CUDA "
                                 "device, falling back to eager")
    if not cuda_available:
        return CudaGraphMode.NONE, (f"CUDA is not available: cudagraph_mode {mode.value} falls back "
                                 "to eager")
    if mode is CudaGraphMode.LOCAL_MLP:
        return mode, (
            f"enforce_eager: true, cudagraph_mode: LOCAL_MLP: attention runs eagerly; each "
            f"decoder layer's post-attention RMSNorm + MLP replays a CUDA graph captured at "
            f"start-up for batch sizes {sizes}")
    if mode is CudaGraphMode.PIECEWISE:
        return mode, (
            f"enforce_eager: true, cudagraph_mode: PIECEWISE: the attention kernels run eagerly; "
            f"the rest of every step (prefill, mixed, decode) replays CUDA graphs captured at "
            f"start-up for token counts {sizes}")
    if mode is CudaGraphMode.FULL_AND_PIECEWISE:
        return mode, (
            f"enforce_eager: false, cudagraph_mode: FULL_AND_PIECEWISE: each decode-only step "
            f"replays one whole-step CUDA graph (batch sizes {list(stage0.decode_capture_sizes)}); "
            f"prefill and mixed steps replay piecewise graphs, attention eager (token counts "
            f"{sizes}); the local MLP graphs are off")
    return mode, (
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
        "enforce_eager: false: the whole codec decoder replays a CUDA graph per (window shape, "
        "batch size) warmed up at start-up (the streaming and widened final window shapes x a ladder "
        "of batch sizes up to max_batch_windows, a batch padded to the next); other shapes decode eagerly")


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
