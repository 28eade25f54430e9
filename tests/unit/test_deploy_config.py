"""Deploy profiles: discovery, shipped values, inheritance, precedence, validation errors."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from higgs_serve.config.deploy import (
    CONNECTOR_NAME,
    CodecGraphPath,
    CudaGraphMode,
    resolve_codec_graph_path,
    resolve_graph_mode,
)
from higgs_serve.config.layers import SHIPPED_DIR, list_shipped_profiles
from higgs_serve.config.loader import load_deploy_config
from higgs_serve.errors import ConfigError

MODEL_TYPE = "higgs_multimodal_qwen3"
HIGH = "higgs_multimodal_qwen3_high_throughput.yaml"
LOW = "higgs_multimodal_qwen3_low_latency.yaml"
FULL_AND_PIECEWISE = "higgs_multimodal_qwen3_full_and_piecewise.yaml"


def write(tmp_path: Path, name: str, doc) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc), encoding="utf-8")
    return path


def without_sources(config) -> dict:
    d = config.to_dict()
    del d["source"], d["layers"]
    return d


# ------------------------------------------------------------------------ discovery


def test_shipped_profiles_are_listed():
    assert list_shipped_profiles() == [f"{MODEL_TYPE}.yaml", FULL_AND_PIECEWISE, HIGH, LOW]


def test_full_and_piecewise_profile_is_low_latency_with_64_seqs_and_piecewise_graphs():
    config = load_deploy_config(FULL_AND_PIECEWISE, MODEL_TYPE)
    low = load_deploy_config(LOW, MODEL_TYPE)
    s0 = config.stage0
    assert s0.max_num_seqs == 64 and not s0.enforce_eager
    assert s0.compilation_config.cudagraph_mode is CudaGraphMode.FULL_AND_PIECEWISE
    assert max(s0.compilation_config.cudagraph_capture_sizes) == 512
    assert resolve_graph_mode(s0, cuda_available=True)[0] is CudaGraphMode.FULL_AND_PIECEWISE
    # everything else is the low-latency profile's
    assert s0.default_sampling_params == low.stage0.default_sampling_params
    # the left context cut to the decoder's receptive field (same audio, less codec work)
    assert config.streaming == dataclasses.replace(low.streaming, codec_left_context_frames=10)
    # Stage 1: codec CUDA graphs, where the user's profiles keep the codec eager
    assert low.stage1.enforce_eager and not config.stage1.enforce_eager
    assert dataclasses.replace(config.stage1, enforce_eager=True) == low.stage1


def test_discovery_by_model_type_finds_the_default_profile():
    config = load_deploy_config(None, MODEL_TYPE)
    assert config.source == str(SHIPPED_DIR / f"{MODEL_TYPE}.yaml")


def test_unknown_model_type_without_deploy_config_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"no shipped deploy profile for model_type 'qwen2'.*"
                                          r"--deploy-config"):
        load_deploy_config(None, "qwen2")


@pytest.mark.parametrize("name", [LOW, LOW.removesuffix(".yaml")])
def test_deploy_config_takes_a_bare_shipped_name(name):
    assert load_deploy_config(name, MODEL_TYPE).source == str(SHIPPED_DIR / LOW)


def test_deploy_config_takes_a_path(tmp_path):
    path = write(tmp_path, "mine.yaml", {"async_chunk": False})
    config = load_deploy_config(str(path), MODEL_TYPE)
    assert config.source == str(path.resolve()) and config.async_chunk is False


def test_missing_deploy_config_is_an_error():
    with pytest.raises(ConfigError, match="'nope.yaml': no such file"):
        load_deploy_config("nope.yaml", MODEL_TYPE)


# ------------------------------------------------------------------------ shipped values


def test_default_profile_equals_high_throughput():
    default = load_deploy_config(None, MODEL_TYPE)
    high = load_deploy_config(HIGH, MODEL_TYPE)
    assert without_sources(default) == without_sources(high)
    assert default.stage0 == high.stage0 and default.stage1 == high.stage1


def test_high_throughput_profile_values():
    config = load_deploy_config(HIGH, MODEL_TYPE, device_count=1)
    s0, s1 = config.stage0, config.stage1
    assert (s0.max_num_seqs, s0.enforce_eager, s0.max_model_len) == (64, True, 8192)
    assert (s0.devices, s0.device, s0.enable_prefix_caching) == ("0", "cuda:0", True)
    assert s0.compilation_config.cudagraph_mode is CudaGraphMode.LOCAL_MLP
    assert s0.compilation_config.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert resolve_graph_mode(s0, cuda_available=True)[0] is CudaGraphMode.LOCAL_MLP
    assert (s1.max_batch_windows, s1.dtype, s1.devices, s1.enforce_eager) == (16, "float32", "0", True)
    assert resolve_codec_graph_path(s1, cuda_available=True)[0] is CodecGraphPath.EAGER  # the owner keeps the codec eager


def test_low_latency_profile_values():
    config = load_deploy_config(LOW, MODEL_TYPE, device_count=1)
    s0 = config.stage0
    assert (s0.max_num_seqs, s0.enforce_eager) == (16, False)
    cc = s0.compilation_config
    assert cc.cudagraph_mode is CudaGraphMode.FULL_DECODE_ONLY
    assert cc.cudagraph_capture_sizes == (1, 2, 4, 8, 16) and cc.cudagraph_num_of_warmups == 1
    path, reason = resolve_graph_mode(s0, cuda_available=True)
    assert path is CudaGraphMode.FULL_DECODE_ONLY and "local MLP graphs are off" in reason


@pytest.mark.parametrize("name", [HIGH, LOW])
def test_shipped_sampling_and_streaming_values(name):
    config = load_deploy_config(name, MODEL_TYPE)
    sp = config.stage0.default_sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k, sp.seed) == (0.8, 0.8, 30, None)
    assert sp.max_tokens == 2048
    st = config.streaming
    assert (st.codec_chunk_frames, st.codec_left_context_frames,
            st.codec_right_holdback_frames, st.initial_codec_chunk_frames,
            st.codec_chunk_doubling) == (25, 25, 4, 1, True)
    assert config.async_chunk is True


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("fp8", "fp8"), ("fp8_e4m3", "fp8")])
def test_kv_cache_dtype_values_and_alias(tmp_path, value, expected):
    path = write(tmp_path, "kv.yaml", {"stages": [{"stage_id": 0, "kv_cache_dtype": value}]})
    config = load_deploy_config(str(path), device_count=1)
    assert config.stage0.kv_cache_dtype == expected
    assert config.to_dict()["stages"][0]["kv_cache_dtype"] == expected


@pytest.mark.parametrize("name", [HIGH, LOW, FULL_AND_PIECEWISE])
def test_shipped_profiles_keep_the_model_dtype_kv_cache(name):
    assert load_deploy_config(name, MODEL_TYPE).stage0.kv_cache_dtype == "auto"


def test_kv_cache_dtype_cli_override_wins_and_bad_values_name_the_flags():
    config = load_deploy_config(HIGH, MODEL_TYPE, stage_overrides={"0": {"kv_cache_dtype": "auto"}},
                                cli_overrides={"0": {"kv_cache_dtype": "fp8_e4m3"}})
    assert config.stage0.kv_cache_dtype == "fp8"
    with pytest.raises(ConfigError, match=r"^command-line flags: stages\[0\]\.kv_cache_dtype: 'int8'"):
        load_deploy_config(HIGH, MODEL_TYPE, cli_overrides={"0": {"kv_cache_dtype": "int8"}})


def test_to_dict_is_json_and_names_graph_paths():
    d = json.loads(json.dumps(load_deploy_config(FULL_AND_PIECEWISE, MODEL_TYPE).to_dict(cuda_available=False)))
    stage0, stage1 = d["stages"]
    assert stage0["compilation_config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert stage0["resolved_graph_path"]["path"] == "NONE"  # the resolved mode: no graphs without CUDA
    assert "CUDA is not available" in stage0["resolved_graph_path"]["reason"]
    assert stage1["enforce_eager"] is False
    assert stage1["resolved_graph_path"]["path"] == "EAGER"  # no CUDA here
    assert "CUDA is not available" in stage1["resolved_graph_path"]["reason"]
    on_gpu = load_deploy_config(FULL_AND_PIECEWISE, MODEL_TYPE).to_dict(cuda_available=True)["stages"][1]
    assert on_gpu["resolved_graph_path"]["path"] == "CUDA_GRAPHS"
    assert d["connectors"][CONNECTOR_NAME]["extra"]["codec_chunk_frames"] == 25


@pytest.mark.parametrize("stage0, cuda, expected, reason_part", [
    ({}, True, CudaGraphMode.LOCAL_MLP, "LOCAL_MLP"),
    ({"enforce_eager": False}, True, CudaGraphMode.FULL_DECODE_ONLY, "FULL_DECODE_ONLY"),
    ({"compilation_config": {"cudagraph_mode": "NONE"}}, True, CudaGraphMode.NONE, "NONE"),
    ({"enforce_eager": False, "compilation_config": {"cudagraph_mode": "NONE"}}, True,
     CudaGraphMode.NONE, "NONE"),
    ({}, False, CudaGraphMode.NONE, "CUDA is not available"),
    ({"devices": "cpu"}, True, CudaGraphMode.NONE, "cpu"),
    ({"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, True, CudaGraphMode.PIECEWISE, "PIECEWISE"),
    ({"enforce_eager": False, "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}, True,
     CudaGraphMode.FULL_AND_PIECEWISE, "FULL_AND_PIECEWISE"),
    ({"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, False, CudaGraphMode.NONE, "CUDA is not available"),
])
def test_graph_path_resolution(tmp_path, stage0, cuda, expected, reason_part):
    path = write(tmp_path, "g.yaml", {"stages": [{"stage_id": 0, **stage0}]})
    config = load_deploy_config(str(path), MODEL_TYPE)
    got, reason = resolve_graph_mode(config.stage0, cuda_available=cuda)
    assert got is expected and reason_part in reason


def test_default_capture_sizes_follow_max_num_seqs(tmp_path):
    path = write(tmp_path, "s.yaml", {"stages": [{"stage_id": 0, "max_num_seqs": 20}]})
    sizes = load_deploy_config(str(path)).stage0.compilation_config.cudagraph_capture_sizes
    assert sizes == (1, 2, 4, 8, 16, 20)


# ------------------------------------------------------------------------ inheritance, precedence


def test_base_config_deep_merges_by_stage_id(tmp_path):
    write(tmp_path, "base.yaml", {
        "stages": [{"stage_id": 0, "max_num_seqs": 8, "default_sampling_params": {"top_k": 5}},
                   {"stage_id": 1, "max_batch_windows": 3}]})
    child = write(tmp_path, "child.yaml", {
        "base_config": "base.yaml",
        "stages": [{"stage_id": 0, "default_sampling_params": {"top_p": 0.5}}]})
    config = load_deploy_config(str(child))
    assert config.stage0.max_num_seqs == 8  # from base
    sp = config.stage0.default_sampling_params
    assert (sp.top_k, sp.top_p, sp.temperature) == (5, 0.5, 0.8)  # base, child, default
    assert config.stage1.max_batch_windows == 3
    assert config.layers == (str(tmp_path / "base.yaml"), str(child))


@pytest.mark.parametrize("stage1, cuda, expected, reason_part", [
    ({}, True, CodecGraphPath.CUDA_GRAPHS, "enforce_eager: false"),  # graphs by default
    ({"enforce_eager": False}, True, CodecGraphPath.CUDA_GRAPHS, "warmed up at start-up"),
    ({"enforce_eager": True}, True, CodecGraphPath.EAGER, "enforce_eager: true"),
    ({}, False, CodecGraphPath.EAGER, "CUDA is not available"),
    ({"devices": "cpu"}, True, CodecGraphPath.EAGER, 'devices is "cpu"'),
])
def test_codec_graph_path_follows_enforce_eager_and_the_machine(tmp_path, stage1, cuda, expected, reason_part):
    path = write(tmp_path, "s.yaml", {"stages": [{"stage_id": 1, **stage1}]})
    s1 = load_deploy_config(str(path), device_count=1).stage1
    assert s1.enforce_eager is stage1.get("enforce_eager", False)
    got, reason = resolve_codec_graph_path(s1, cuda_available=cuda)
    assert got is expected and reason_part in reason


def test_codec_enforce_eager_from_stage_overrides():
    config = load_deploy_config(LOW, MODEL_TYPE, stage_overrides='{"1": {"enforce_eager": true}}')
    assert config.stage1.enforce_eager is True and config.stage0.enforce_eager is False


def test_the_deadline_policys_settings_read_and_checked():
    """Issue 53: stages[0].deadlines, defaults written once in config/deploy.py."""
    default = load_deploy_config(LOW, MODEL_TYPE).stage0.deadlines
    assert default.enabled and default.realtime_headroom == 0.1 and default.park_slack_ms == 1000
    config = load_deploy_config(LOW, MODEL_TYPE, stage_overrides={"0": {"deadlines": {
        "enabled": True, "realtime_headroom": 0.25, "lead_margin_ms": -20}}}).stage0.deadlines
    assert (config.enabled, config.realtime_headroom, config.lead_margin_ms) == (True, 0.25, -20)
    assert not load_deploy_config(LOW, MODEL_TYPE, stage_overrides={"0": {"deadlines": {
        "enabled": False}}}).stage0.deadlines.enabled
    # with the policy off its settings would be applied by nothing: refused, naming the key
    with pytest.raises(ConfigError, match=r"deadlines\.realtime_headroom: applies only with the deadline policy on"):
        load_deploy_config(LOW, MODEL_TYPE, stage_overrides={"0": {"deadlines": {
            "enabled": False, "realtime_headroom": 0.25}}})
    assert config.min_prefill_chunk_tokens == default.min_prefill_chunk_tokens
    bad = {"realtime_headroom": 1.0, "park_slack_ms": -1, "min_prefill_chunk_tokens": 0,
           "lead_margin_ms": -101, "first_chunk_follows_load": "yes", "budget": 1,
           "step_prior_base_ms": 20}  # gone with issue 59: an engine with the policy on times its steps
    for key, value in bad.items():
        with pytest.raises(ConfigError, match=rf"^--stage-overrides: stages\[0\]\.deadlines\.{key}: "):
            load_deploy_config(LOW, MODEL_TYPE, stage_overrides={"0": {"deadlines": {key: value}}})


def test_base_config_may_name_a_shipped_profile(tmp_path):
    child = write(tmp_path, "c.yaml", {"base_config": LOW, "stages": [
        {"stage_id": 0, "compilation_config": {"cudagraph_capture_sizes": [1, 4]}}]})
    cc = load_deploy_config(str(child)).stage0.compilation_config
    assert cc.cudagraph_mode is CudaGraphMode.FULL_DECODE_ONLY  # inherited
    assert cc.cudagraph_capture_sizes == (1, 4)  # lists are replaced, not merged


def test_base_config_cycle_is_an_error(tmp_path):
    write(tmp_path, "a.yaml", {"base_config": "b.yaml"})
    write(tmp_path, "b.yaml", {"base_config": "a.yaml"})
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_deploy_config(str(tmp_path / "a.yaml"))


def test_precedence_defaults_yaml_stage_overrides_cli(tmp_path):
    path = write(tmp_path, "p.yaml", {"stages": [
        {"stage_id": 0, "max_num_seqs": 8, "max_num_batched_tokens": 1024, "kv_block_size": 32}]})
    config = load_deploy_config(
        str(path),
        stage_overrides='{"0": {"max_num_seqs": 4, "max_num_batched_tokens": 512}}',
        cli_overrides={"0": {"max_num_seqs": 2}, "async_chunk": False},
    )
    s0 = config.stage0
    assert s0.max_num_seqs == 2  # CLI flag beats --stage-overrides
    assert s0.max_num_batched_tokens == 512  # --stage-overrides beats YAML
    assert s0.kv_block_size == 32  # YAML beats defaults
    assert s0.max_model_len == 8192  # default
    assert config.async_chunk is False
    assert config.layers[-2:] == ("--stage-overrides", "command-line flags")


def test_stage_overrides_deep_merge_nested_keys():
    config = load_deploy_config(LOW, stage_overrides={
        "0": {"compilation_config": {"cudagraph_num_of_warmups": 3}}, "1": {"devices": "cpu"}})
    cc = config.stage0.compilation_config
    assert cc.cudagraph_num_of_warmups == 3 and cc.cudagraph_capture_sizes == (1, 2, 4, 8, 16)
    assert config.stage1.device == "cpu" and config.stage0.device == "cuda:0"


# ------------------------------------------------------------------------ validation errors


# (YAML stage 0 entry or top-level doc, expected key path, expected problem text)
STAGE0_ERRORS = [
    ({"max_num_seq": 4}, "stages[0].max_num_seq", "unknown key"),
    ({"max_num_seqs": "4"}, "stages[0].max_num_seqs", "expected an integer"),
    ({"max_num_seqs": True}, "stages[0].max_num_seqs", "expected an integer"),
    ({"max_num_seqs": 0}, "stages[0].max_num_seqs", "below the minimum 1"),
    ({"gpu_memory_utilization": 0}, "stages[0].gpu_memory_utilization", "outside (0, 1]"),
    ({"gpu_memory_utilization": 1.5}, "stages[0].gpu_memory_utilization", "outside (0, 1]"),
    ({"enforce_eager": "yes"}, "stages[0].enforce_eager", "expected true or false"),
    ({"max_model_len": 9000}, "stages[0].max_model_len", "above the maximum 8192"),
    ({"kv_block_size": 24}, "stages[0].kv_block_size", "not a power of two"),
    ({"num_gpu_blocks": 0}, "stages[0].num_gpu_blocks", "below the minimum 1"),
    ({"kv_cache_dtype": "fp16"}, "stages[0].kv_cache_dtype", "'fp16' is not one of auto, fp8, fp8_e4m3"),
    ({"kv_cache_dtype": "fp8_e5m2"}, "stages[0].kv_cache_dtype", "is not one of auto, fp8"),
    ({"kv_cache_dtype": None}, "stages[0].kv_cache_dtype", "None is not one of"),
    ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "stages[0].max_num_batched_tokens",
     "below max_num_seqs"),
    ({"devices": 0}, "stages[0].devices", "quote it"),
    ({"devices": "0,1"}, "stages[0].devices", "one CUDA device index"),
    ({"devices": "1"}, "stages[0].devices", "CUDA device 1 does not exist"),
    ({"default_sampling_params": {"temperature": 3}},
     "stages[0].default_sampling_params.temperature", "outside [0, 2]"),
    ({"default_sampling_params": {"top_p": 0}}, "stages[0].default_sampling_params.top_p",
     "outside (0, 1]"),
    ({"default_sampling_params": {"top_k": 2000}}, "stages[0].default_sampling_params.top_k",
     "outside [0, 1026]"),
    ({"default_sampling_params": {"seed": -1}}, "stages[0].default_sampling_params.seed",
     "outside [0, 2**63 - 1]"),
    ({"default_sampling_params": {"max_tokens": 0}},
     "stages[0].default_sampling_params.max_tokens", "below the minimum 1"),
    ({"default_sampling_params": {"repetition_penalty": 1.1}},
     "stages[0].default_sampling_params.repetition_penalty", "unknown key"),
    ({"compilation_config": {"cudagraph_mode": "FULL"}},
     "stages[0].compilation_config.cudagraph_mode", "not one of NONE, LOCAL_MLP"),
    ({"enforce_eager": False, "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
     "stages[0].compilation_config.cudagraph_mode", "set enforce_eager: true, or cudagraph_mode: "
                                                    "FULL_AND_PIECEWISE"),
    ({"max_num_batched_tokens": 256, "compilation_config": {"cudagraph_mode": "PIECEWISE",
                                                            "cudagraph_capture_sizes": [1, 64, 512]}},
     "stages[0].compilation_config.cudagraph_capture_sizes", "512 is above max_num_batched_tokens 256"),
    ({"max_num_seqs": 16, "compilation_config": {"cudagraph_capture_sizes": [1, 8, 32]}},
     "stages[0].compilation_config.cudagraph_capture_sizes", "32 is above max_num_seqs 16"),
    ({"compilation_config": {"cudagraph_capture_sizes": [0, 1]}},
     "stages[0].compilation_config.cudagraph_capture_sizes", "below the minimum 1"),
    ({"compilation_config": {"cudagraph_capture_sizes": [1, 1]}},
     "stages[0].compilation_config.cudagraph_capture_sizes", "lists a size twice"),
    ({"compilation_config": {"cudagraph_capture_sizes": []}},
     "stages[0].compilation_config.cudagraph_capture_sizes", "needs at least one size"),
    ({"compilation_config": {"cudagraph_num_of_warmups": -1}},
     "stages[0].compilation_config.cudagraph_num_of_warmups", "below the minimum 0"),
    ({"compilation_config": "FULL"}, "stages[0].compilation_config", "expected a mapping"),
]

TOP_LEVEL_ERRORS = [
    ({"async_chunk": 1}, "async_chunk", "expected true or false"),
    ({"stage_args": []}, "stage_args", "unknown key"),
    ({"connectors": {"shm": {"extra": {}}}}, "connectors.shm", "unknown key"),
    ({"connectors": {CONNECTOR_NAME: {"extra": {"codec_streaming": True}}}},
     f"connectors.{CONNECTOR_NAME}.extra.codec_streaming", "unknown key"),
    ({"connectors": {CONNECTOR_NAME: {"extra": {"codec_chunk_frames": 0}}}},
     f"connectors.{CONNECTOR_NAME}.extra.codec_chunk_frames", "below the minimum 1"),
    ({"connectors": {CONNECTOR_NAME: {"extra": {"codec_right_holdback_frames": -1}}}},
     f"connectors.{CONNECTOR_NAME}.extra.codec_right_holdback_frames", "below the minimum 0"),
    ({"connectors": {CONNECTOR_NAME: {"extra": {"codec_chunk_doubling": "yes"}}}},
     f"connectors.{CONNECTOR_NAME}.extra.codec_chunk_doubling", "expected true or false"),
    ({"stages": [{"stage_id": 1, "enforce_eager": "no"}]}, "stages[1].enforce_eager",
     "expected true or false"),
    ({"stages": [{"stage_id": 1, "dtype": "int8"}]}, "stages[1].dtype", "not one of float32"),
    ({"stages": [{"stage_id": 1, "max_batch_windows": 0}]}, "stages[1].max_batch_windows",
     "below the minimum 1"),
    ({"stages": [{"stage_id": 1, "devices": "3"}]}, "stages[1].devices", "does not exist"),
    ({"stages": [{"stage_id": 2}]}, "stages[0].stage_id", "is not a stage"),
    ({"stages": [{"stage_id": 0}, {"stage_id": 0}]}, "stages[1].stage_id", "listed twice"),
    ({"stages": [{"max_num_seqs": 4}]}, "stages[0]", "with a stage_id"),
    ({"stages": {"0": {}}}, "stages", "expected a list"),
    ({"base_config": 3}, "base_config", "expected a file name"),
    ({"base_config": "missing.yaml"}, "base_config", "neither a file"),
]


def _expect_error(path: Path, key: str, problem: str, **kwargs):
    with pytest.raises(ConfigError) as info:
        load_deploy_config(str(path), device_count=1, **kwargs)
    message = str(info.value)
    assert message.startswith(str(path.resolve())), message  # names the file first
    assert f"{key}:" in message and problem in message, message


@pytest.mark.parametrize("stage0, key, problem", STAGE0_ERRORS)
def test_stage0_validation_errors_name_key_and_file(tmp_path, stage0, key, problem):
    path = write(tmp_path, "bad.yaml", {"stages": [{"stage_id": 0, **stage0}]})
    _expect_error(path, key, problem)


@pytest.mark.parametrize("doc, key, problem", TOP_LEVEL_ERRORS)
def test_top_level_validation_errors_name_key_and_file(tmp_path, doc, key, problem):
    _expect_error(write(tmp_path, "bad.yaml", doc), key, problem)


@pytest.mark.parametrize("stage0, culprit", [
    ({"enforce_eager": True, "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}},
     "FULL_DECODE_ONLY"),
    ({"enforce_eager": False, "compilation_config": {"cudagraph_mode": "LOCAL_MLP"}},
     "LOCAL_MLP"),
    ({"enforce_eager": True, "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
     "FULL_AND_PIECEWISE"),
])
def test_asking_for_both_graph_paths_is_an_error(tmp_path, stage0, culprit):
    path = write(tmp_path, "both.yaml", {"stages": [{"stage_id": 0, **stage0}]})
    _expect_error(path, "stages[0].compilation_config.cudagraph_mode", "both graph paths")
    with pytest.raises(ConfigError, match=rf"{culprit}.*stages\[0\]\.enforce_eager"):
        load_deploy_config(str(path))


def test_piecewise_modes_default_to_token_counts_above_the_batch_sizes(tmp_path):
    stage0 = {"enforce_eager": False, "max_num_seqs": 16, "max_num_batched_tokens": 300,
              "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}
    config = load_deploy_config(str(write(tmp_path, "p.yaml", {"stages": [{"stage_id": 0, **stage0}]})))
    assert config.stage0.compilation_config.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 96, 128, 192, 256)


def test_piecewise_graph_policy_splits_decode_sizes_from_token_counts(tmp_path):
    from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher

    stage0 = {"enforce_eager": False, "max_num_seqs": 8,
              "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                     "cudagraph_capture_sizes": [1, 4, 8, 64, 256]}}
    config = load_deploy_config(str(write(tmp_path, "p.yaml", {"stages": [{"stage_id": 0, **stage0}]})))
    policy = CudaGraphDispatcher.from_config(config.stage0, cuda_available=True)
    assert policy.mode.decode_mode is CudaGraphMode.FULL and policy.mode.mixed_mode is CudaGraphMode.PIECEWISE
    assert policy.decode_sizes == (1, 4, 8) and policy.piecewise_sizes == (1, 4, 8, 64, 256)
    assert policy.dispatch(3, True) == (CudaGraphMode.FULL, 4)
    assert policy.dispatch(3, False) == (CudaGraphMode.PIECEWISE, 4)  # mixed: piecewise
    assert policy.dispatch(70, False) == (CudaGraphMode.PIECEWISE, 256)
    assert policy.dispatch(257, False) == (CudaGraphMode.NONE, 257)


def test_both_graph_paths_via_override_names_both_sources():
    # The low-latency YAML sets FULL_DECODE_ONLY; the flag asks for eager: both paths.
    with pytest.raises(ConfigError) as info:
        load_deploy_config(LOW, cli_overrides={"0": {"enforce_eager": True}})
    message = str(info.value)
    assert message.startswith(f"{SHIPPED_DIR / LOW} and command-line flags: ")
    assert "stages[0].compilation_config.cudagraph_mode" in message


def test_lowering_max_num_seqs_below_capture_sizes_is_an_error_naming_both_sources():
    with pytest.raises(ConfigError) as info:
        load_deploy_config(LOW, stage_overrides={"0": {"max_num_seqs": 4}})
    message = str(info.value)
    assert message.startswith(f"{SHIPPED_DIR / LOW} and --stage-overrides: ")
    assert "cudagraph_capture_sizes: 8 is above max_num_seqs 4" in message


def test_errors_name_the_base_file_that_set_the_bad_value(tmp_path):
    base = write(tmp_path, "base.yaml", {"stages": [{"stage_id": 0, "max_num_seqs": -3}]})
    child = write(tmp_path, "child.yaml", {"base_config": "base.yaml"})
    with pytest.raises(ConfigError, match=rf"^{base}: stages\[0\].max_num_seqs: "):
        load_deploy_config(str(child))


def test_default_device_missing_names_the_loaded_file(tmp_path):
    path = write(tmp_path, "d.yaml", {"async_chunk": True})
    with pytest.raises(ConfigError, match=rf"^{path} \(default value\): stages\[0\].devices: "
                                          r"CUDA device 0 does not exist: this machine has 0"):
        load_deploy_config(str(path), device_count=0)


@pytest.mark.parametrize("overrides, problem", [
    ('{"0": {"max_num_seqs": 4}', "--stage-overrides: not valid JSON"),
    ('{"2": {}}', "--stage-overrides: stages[2]: 2 is not a stage"),
    ('{"async_chunk": false}', "--stage-overrides: async_chunk: not a stage id"),
    ('{"0": 4}', "--stage-overrides: stages[0]: expected a mapping"),
    ('{"0": {"stage_id": 1}}', "stages[0].stage_id: cannot be changed"),
    ('{"0": {"max_num_seqz": 4}}', "--stage-overrides: stages[0].max_num_seqz: unknown key"),
    ('{"1": {"dtype": "fp8"}}', "--stage-overrides: stages[1].dtype: 'fp8' is not one of"),
])
def test_stage_override_errors(overrides, problem):
    with pytest.raises(ConfigError) as info:
        load_deploy_config(HIGH, stage_overrides=overrides)
    assert problem in str(info.value)


def test_cli_overrides_may_not_set_base_config():
    with pytest.raises(ConfigError, match="command-line flags: base_config"):
        load_deploy_config(HIGH, cli_overrides={"base_config": LOW})


@pytest.mark.parametrize("text, problem", [
    ("stages: [\n", "not valid YAML"),
    ("- 1\n- 2\n", "top level must be a mapping"),
    ("async_chunk: true\nasync_chunk: false\n", "key 'async_chunk' appears twice"),
])
def test_malformed_yaml_names_the_file(tmp_path, text, problem):
    path = write(tmp_path, "m.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_deploy_config(str(path))
    assert str(path) in str(info.value) and problem in str(info.value)


def test_empty_yaml_gives_all_defaults(tmp_path):
    config = load_deploy_config(str(write(tmp_path, "e.yaml", "")))
    assert config.stage0.max_num_seqs == 16 and config.stage0.compilation_config.cudagraph_mode \
        is CudaGraphMode.LOCAL_MLP and config.stage1.dtype == "float32"


def test_codec_tf32_precision_is_accepted_and_reaches_the_builder(tiny_model_dir):
    """Stage 1 `dtype: tf32` keeps float32 weights (TF32 only changes the conv math on CUDA)."""
    import torch

    from higgs_serve.engine.builder import RuntimeOptions, load_model

    deploy = load_deploy_config(None, "higgs_multimodal_qwen3",
                                cli_overrides={"0": {"devices": "cpu"}, "1": {"devices": "cpu", "dtype": "tf32"}})
    assert deploy.stage1.dtype == "tf32"
    loaded = load_model(str(tiny_model_dir), RuntimeOptions(device="cpu"), deploy)
    assert next(loaded.codec.parameters()).dtype == torch.float32


BENCHMARK_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "configs").glob("*.yaml"))


def test_benchmark_configs_are_found():
    assert BENCHMARK_CONFIGS  # the test below would otherwise pass on no configs at all


@pytest.mark.parametrize("path", BENCHMARK_CONFIGS, ids=lambda p: p.name)
def test_every_benchmark_config_loads(path):
    """The configs the results README's commands name must stay valid as keys change."""
    config = load_deploy_config(str(path), MODEL_TYPE)
    assert config.stage0.max_num_seqs >= 1
