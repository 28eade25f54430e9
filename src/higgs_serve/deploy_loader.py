"""Loading a deploy profile: find and merge its layers (`deploy_layers`), then read the merged
document into the typed, validated `DeployConfig` of `deploy_config` (with `deploy_reader`): every
key into a typed field, anything else an error that names the file (or override) and key path.
"""

from __future__ import annotations

from typing import Any

from higgs_serve.deploy_config import (
    CODEC_DTYPES,
    CONNECTOR_NAME,
    KV_CACHE_DTYPE_ALIASES,
    KV_CACHE_DTYPES,
    MODEL_MAX_LEN,
    CodecStageConfig,
    CompilationConfig,
    CudaGraphMode,
    DefaultSamplingParams,
    DeployConfig,
    StreamingWindowConfig,
    TalkerStageConfig,
)
from higgs_serve.deploy_layers import CODEC_STAGE_ID, TALKER_STAGE_ID, KeyPath, collect_layers, merge_layers
from higgs_serve.deploy_reader import ReadContext, Section, key_text
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
        codec_chunk_doubling=extra.boolean("codec_chunk_doubling", True),
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
    return KV_CACHE_DTYPE_ALIASES.get(name, name)


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
    mode_name = section.choice("cudagraph_mode", None, CudaGraphMode.config_values())
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
