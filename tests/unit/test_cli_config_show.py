"""`higgs-serve config show`: the resolved profile, and how --max-num-seqs fits the profile."""

from __future__ import annotations

import json

from higgs_serve.cli import main

LOW = "higgs_multimodal_qwen3_low_latency"


def _show(capsys, tiny_model_dir, *flags: str) -> dict:
    assert main(["--log-level", "WARNING", "config", "show", str(tiny_model_dir), "--device", "cpu", *flags]) == 0
    return json.loads(capsys.readouterr().out)["stages"][0]


def test_max_num_seqs_trims_the_profile_capture_sizes(capsys, tiny_model_dir):
    stage0 = _show(capsys, tiny_model_dir, "--deploy-config", LOW, "--max-num-seqs", "4")
    assert stage0["max_num_seqs"] == 4
    assert stage0["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4]
    assert stage0["resolved_graph_path"]["path"] == "NONE"  # no CUDA here: no graphs, said with a reason
    assert "CUDA" in stage0["resolved_graph_path"]["reason"] or "cpu" in stage0["resolved_graph_path"]["reason"]


def test_max_num_seqs_raised_keeps_explicit_capture_sizes(capsys, tiny_model_dir):
    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    overrides = json.dumps({"0": {"compilation_config": {"cudagraph_capture_sizes": sizes}}})
    stage0 = _show(capsys, tiny_model_dir, "--deploy-config", LOW, "--max-num-seqs", "64",
                   "--stage-overrides", overrides)
    assert stage0["max_num_seqs"] == 64
    assert stage0["compilation_config"]["cudagraph_capture_sizes"] == sizes
    assert stage0["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY"


def test_max_num_seqs_raised_without_sizes_adds_the_new_bound(capsys, tiny_model_dir):
    stage0 = _show(capsys, tiny_model_dir, "--deploy-config", LOW, "--max-num-seqs", "64")
    assert stage0["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 64]


def test_bad_stage_overrides_is_a_clear_error(capsys, tiny_model_dir):
    code = main(["--log-level", "WARNING", "config", "show", str(tiny_model_dir), "--device", "cpu",
                 "--max-num-seqs", "4", "--stage-overrides", "{bad"])
    err = capsys.readouterr().err
    assert code == 2 and "--stage-overrides" in err and "Traceback" not in err


def test_kv_cache_dtype_flag_shows_in_the_resolved_profile(capsys, tiny_model_dir):
    assert _show(capsys, tiny_model_dir)["kv_cache_dtype"] == "auto"
    assert _show(capsys, tiny_model_dir, "--kv-cache-dtype", "fp8")["kv_cache_dtype"] == "fp8"
    assert _show(capsys, tiny_model_dir, "--kv-cache-dtype", "fp8_e4m3")["kv_cache_dtype"] == "fp8"


def test_bad_kv_cache_dtype_flag_is_a_clear_error(capsys, tiny_model_dir):
    code = main(["--log-level", "WARNING", "config", "show", str(tiny_model_dir), "--device", "cpu",
                 "--kv-cache-dtype", "fp4"])
    err = capsys.readouterr().err
    assert code == 2 and "kv_cache_dtype" in err and "'fp4' is not one of" in err and "Traceback" not in err
