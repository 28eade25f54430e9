"""Loading a deploy profile: find and merge its layers (`config.layers`), then read the merged
document into the typed, validated `DeployConfig` of `config.deploy` (with `config.reader`): every
key into a typed field, anything else an error that names the file (or override) and key path.
"""

from __future__ import annotations

import json
from dataclasses import fields

from higgs_serve.config.deploy import (
    CODEC_DTYPES,
    CONNECTOR_NAME,
    KV_CACHE_DTYPE_ALIASES,
    KV_CACHE_DTYPES,
    MODEL_MAX_LEN,
    CodecStageConfig,
    CompilationConfig,
    CudaGraphMode,
    DeadlineConfig,
    DefaultSamplingParams,
    DeployConfig,
    StreamingWindowConfig,
    TalkerStageConfig,
    default_capture_sizes,
)
from higgs_serve.config.layers import CODEC_STAGE_ID, TALKER_STAGE_ID, KeyPath, collect_layers, merge_layers
from higgs_serve.config.reader import ReadContext, Section, key_text
from higgs_serve.config.validators import (
    fraction_problem,
    is_real,
    int_problem,
    seed_problem,
    temperature_problem,
    top_k_problem,
    top_p_problem,
)

# A key left out of every layer takes the dataclass default: the defaults are written once, in
# config/deploy.py (and config/sampling_defaults.py), and read from these instances.
_ASYNC_CHUNK = next(f.default for f in fields(DeployConfig) if f.name == "async_chunk")
_WATERMARK = next(f.default for f in fields(DeployConfig) if f.name == "watermark")
_WINDOW = StreamingWindowConfig()
_TALKER = TalkerStageConfig()
_COMPILATION = CompilationConfig()
_SAMPLING = DefaultSamplingParams()
_CODEC = CodecStageConfig()
_DEADLINES = DeadlineConfig()


def load_deploy_config(
    deploy_config: str | None = None,
    model_type: str | None = None,
    stage_overrides: str | dict | None = None,
    cli_overrides: dict | None = None,
    device_count: int | None = None,
) -> DeployConfig:
    """Find, merge and validate a deploy config (precedence: see `config.layers`).

    `stage_overrides`: `--stage-overrides` JSON (or its parsed dict), `{"0": {...}, "1": {...}}`.
    `cli_overrides`: the same per-stage shape from explicit CLI flags, plus top-level keys
    (e.g. `{"async_chunk": False}`). `device_count`: CUDA devices on this machine (None skips
    the device check).
    """
    path, layers = collect_layers(deploy_config, model_type, stage_overrides, cli_overrides)
    merged, origins = merge_layers(layers)
    ctx = ReadContext(origins, f"{path} (default value)", device_count)
    return _build(merged, ctx, str(path), tuple(source for source, _ in layers))


def load_for_command_line(
    deploy_config: str | None,
    model_type: str | None,
    *,
    stage_overrides: str | None = None,
    force_cpu: bool = False,
    kv_cache_dtype: str | None = None,
    max_num_seqs: int | None = None,
    watermark: bool | None = None,
    device_count: int | None = None,
) -> DeployConfig:
    """The deploy config the command-line values select; the CLI only hands them over.

    `force_cpu` puts both stages on the CPU (`--device cpu`, or no CUDA). `kv_cache_dtype` and
    `max_num_seqs` override Stage 0's keys, validated like every other key. `--max-num-seqs` also
    refits what the profile sized for its own max_num_seqs (the capture sizes, the token budget)
    to the new bound, unless `--stage-overrides` sets those keys itself. `watermark` (`--watermark
    on|off`) overrides the profile's top-level `watermark`.
    """
    cli: dict = {}
    if watermark is not None:
        cli["watermark"] = watermark
    if force_cpu:
        cli["0"] = {"devices": "cpu"}
        cli["1"] = {"devices": "cpu"}
    if kv_cache_dtype is not None:
        cli.setdefault("0", {})["kv_cache_dtype"] = kv_cache_dtype

    def load(overrides: dict, stage_overrides=stage_overrides) -> DeployConfig:
        return load_deploy_config(deploy_config, model_type, stage_overrides=stage_overrides,
                                  cli_overrides=overrides or None, device_count=device_count)

    if max_num_seqs is None:
        return load(cli)
    profile = load(cli, stage_overrides=None).stage0
    cli.setdefault("0", {}).update(_refit_max_num_seqs(profile, max_num_seqs, _stage0_keys(stage_overrides)))
    return load(cli)


def _refit_max_num_seqs(profile: TalkerStageConfig, max_num_seqs: int, given: dict) -> dict:
    """Stage 0 overrides for `--max-num-seqs`: the bound, plus the capture sizes and token budget
    the profile sized for its own bound, unless `given` (--stage-overrides' stage 0) sets them."""
    stage0: dict = {"max_num_seqs": max_num_seqs}
    if "cudagraph_capture_sizes" not in given.get("compilation_config", {}):
        compilation = profile.compilation_config
        sizes = [s for s in compilation.cudagraph_capture_sizes if s < max_num_seqs] + [max_num_seqs]
        if compilation.cudagraph_mode.piecewise:  # the token counts above the batch sizes stay
            sizes += [s for s in compilation.cudagraph_capture_sizes if s > max(max_num_seqs, profile.max_num_seqs)]
        stage0["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    if "max_num_batched_tokens" not in given:
        stage0["max_num_batched_tokens"] = max(max_num_seqs, profile.max_num_batched_tokens)
    return stage0


def _stage0_keys(stage_overrides: str | None) -> dict:
    """Stage 0's part of --stage-overrides (malformed JSON is reported by `load_deploy_config`)."""
    if not stage_overrides:
        return {}
    try:
        parsed = json.loads(stage_overrides)
    except json.JSONDecodeError:
        return {}
    stage0 = parsed.get("0", {}) if isinstance(parsed, dict) else {}
    return stage0 if isinstance(stage0, dict) else {}


def _build(doc: dict, ctx: ReadContext, source: str, layers: tuple[str, ...]) -> DeployConfig:
    root = Section(doc, (), ctx)
    async_chunk = root.boolean("async_chunk", _ASYNC_CHUNK)
    watermark = root.boolean("watermark", _WATERMARK)
    streaming = _build_streaming(root.section("connectors"))
    stages = root.section("stages")
    stage0 = _build_talker(stages.section(TALKER_STAGE_ID))
    stage1 = _build_codec(stages.section(CODEC_STAGE_ID))
    stages.finish()
    root.finish()
    return DeployConfig(source=source, stage0=stage0, stage1=stage1, async_chunk=async_chunk,
                        watermark=watermark, streaming=streaming, layers=layers)


def _build_streaming(connectors: Section) -> StreamingWindowConfig:
    connector = connectors.section(CONNECTOR_NAME)
    extra = connector.section("extra")
    config = StreamingWindowConfig(
        codec_chunk_frames=extra.integer("codec_chunk_frames", _WINDOW.codec_chunk_frames, 1),
        codec_left_context_frames=extra.integer("codec_left_context_frames", _WINDOW.codec_left_context_frames, 0),
        codec_right_holdback_frames=extra.integer("codec_right_holdback_frames", _WINDOW.codec_right_holdback_frames, 0),
        initial_codec_chunk_frames=extra.integer("initial_codec_chunk_frames", _WINDOW.initial_codec_chunk_frames, 1),
        codec_chunk_doubling=extra.boolean("codec_chunk_doubling", _WINDOW.codec_chunk_doubling),
    )
    for section in (extra, connector, connectors):
        section.finish()
    return config


def _build_talker(stage: Section) -> TalkerStageConfig:
    max_num_seqs = stage.integer("max_num_seqs", _TALKER.max_num_seqs, 1)
    enforce_eager = stage.boolean("enforce_eager", _TALKER.enforce_eager)
    max_num_batched_tokens = stage.integer("max_num_batched_tokens", _TALKER.max_num_batched_tokens, 1)
    if max_num_batched_tokens < max_num_seqs:
        raise stage.ctx.error(
            [stage.key("max_num_batched_tokens"), stage.key("max_num_seqs")],
            f"{max_num_batched_tokens} is below max_num_seqs {max_num_seqs}: a step could not "
            f"hold one decode token per running request")
    kv_block_size = stage.integer("kv_block_size", _TALKER.kv_block_size, 1)
    if kv_block_size & (kv_block_size - 1):
        raise stage.error("kv_block_size", f"{kv_block_size} is not a power of two")
    config = TalkerStageConfig(
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=stage.checked("gpu_memory_utilization", _TALKER.gpu_memory_utilization, fraction_problem),
        enforce_eager=enforce_eager,
        enable_prefix_caching=stage.boolean("enable_prefix_caching", _TALKER.enable_prefix_caching),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=stage.integer("max_model_len", _TALKER.max_model_len, 1, MODEL_MAX_LEN),
        devices=_devices(stage, _TALKER.devices),
        kv_block_size=kv_block_size,
        num_gpu_blocks=stage.integer("num_gpu_blocks", _TALKER.num_gpu_blocks, 1, optional=True),
        kv_cache_dtype=_kv_cache_dtype(stage),
        default_sampling_params=_build_sampling(stage.section("default_sampling_params")),
        compilation_config=_build_compilation(stage, enforce_eager, max_num_seqs, max_num_batched_tokens),
        deadlines=_build_deadlines(stage.section("deadlines")),
    )
    stage.finish()
    return config


def _build_deadlines(section: Section) -> DeadlineConfig:
    d = _DEADLINES

    def headroom_problem(value) -> str | None:
        if not is_real(value):
            return f"expected a number, got {type(value).__name__} {value!r}"
        return None if 0 <= value < 1 else f"{value!r} is outside [0, 1)"

    config = DeadlineConfig(
        enabled=section.boolean("enabled", d.enabled),
        realtime_headroom=section.checked("realtime_headroom", d.realtime_headroom, headroom_problem),
        park_slack_ms=section.integer("park_slack_ms", d.park_slack_ms, 0),
        first_audio_target_ms=section.integer("first_audio_target_ms", d.first_audio_target_ms, 0),
        min_prefill_chunk_tokens=section.integer("min_prefill_chunk_tokens", d.min_prefill_chunk_tokens, 1),
        # below -100 ms every stream would have stalled before the limit backed off
        lead_margin_ms=section.integer("lead_margin_ms", d.lead_margin_ms, -100, 1000),
        first_chunk_follows_load=section.boolean("first_chunk_follows_load", d.first_chunk_follows_load),
    )
    section.finish()
    inert = [key for key in section.data if key != "enabled"]
    if not config.enabled and inert:  # the policy's settings would be accepted and applied by nothing
        raise section.error(inert[0], "applies only with the deadline policy on (stages[0].deadlines.enabled: "
                                      "true; the default profile has it off)")
    return config


def _kv_cache_dtype(stage: Section) -> str:
    name = stage.choice("kv_cache_dtype", _TALKER.kv_cache_dtype, KV_CACHE_DTYPES)
    return KV_CACHE_DTYPE_ALIASES.get(name, name)


def _devices(stage: Section, default: str) -> str:
    value = stage.raw("devices", default)
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
        temperature=section.checked("temperature", _SAMPLING.temperature, temperature_problem),
        top_p=section.checked("top_p", _SAMPLING.top_p, top_p_problem),
        top_k=section.checked("top_k", _SAMPLING.top_k, top_k_problem),
        max_tokens=section.integer("max_tokens", _SAMPLING.max_tokens, 1),
        seed=section.checked("seed", _SAMPLING.seed, seed_problem),
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
        cudagraph_num_of_warmups=section.integer("cudagraph_num_of_warmups", _COMPILATION.cudagraph_num_of_warmups, 0),
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
        return default_capture_sizes(max_num_seqs, limit if mode.piecewise else max_num_seqs)
    if not isinstance(value, list):
        raise section.error(name, f"expected a list of batch sizes, got {type(value).__name__}")
    for size in value:
        problem = int_problem(size, 1)  # a positive integer
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


def _build_codec(stage: Section) -> CodecStageConfig:
    config = CodecStageConfig(
        enforce_eager=stage.boolean("enforce_eager", _CODEC.enforce_eager),
        max_batch_windows=stage.integer("max_batch_windows", _CODEC.max_batch_windows, 1),
        devices=_devices(stage, _CODEC.devices),
        dtype=stage.choice("dtype", _CODEC.dtype, CODEC_DTYPES),
    )
    stage.finish()
    return config
