"""CPU smoke tests of the benchmark tools (benchmarks/) on the tiny model: the GPU timeline's math, the
step benchmark's plans and one eager run, one real-server streaming run, and the plots (bench_serving's
own arithmetic: test_bench_serving_math.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.bench_modules import bench_path, load_bench

bench_step = load_bench("bench_step")
gpu_timeline = load_bench("gpu_timeline")


# ------------------------------------------------------------------------------ GPU timeline
def test_gpu_timeline_counts_busy_overlap_and_gaps():
    def kernel(stream, ts, dur, name="k"):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    trace = {"traceEvents": [
        kernel(7, 0, 100), kernel(7, 150, 50),  # step stream: 150 µs busy, a 50 µs gap inside
        kernel(9, 180, 100, "conv"),  # codec stream: overlaps the step stream for 20 µs
        kernel(9, 1500, 10, "conv"),  # after a 1,220 µs idle gap
        kernel(7, 1500, 10, "k"),  # starts and ends with the one before: ties must sort
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host side: ignored
    ]}
    s = gpu_timeline.summarize(gpu_timeline.gpu_events(trace))
    assert s["events"] == 5
    assert s["span_ms"] == pytest.approx(1.51)
    assert s["busy_ms"] == pytest.approx((100 + 130 + 10) / 1e3)
    assert s["streams_sum_ms"] == pytest.approx((160 + 110) / 1e3)
    assert s["overlap_ms"] == pytest.approx(0.03)
    assert s["streams"]["9"]["top_ms"] == {"conv": pytest.approx(0.11)}
    assert s["idle_gaps"]["10-100us"] == {"count": 1, "ms": pytest.approx(0.05)}
    assert s["idle_gaps"]["1000-infus"] == {"count": 1, "ms": pytest.approx(1.22)}
    assert s["longest_gaps"][0] == {"at": "0.3 ms (19 %)", "ms": pytest.approx(1.22), "before": "9:conv",
                                    "after": "9:conv"}
    assert s["longest_gaps"][1]["before"] == "7:k" and s["longest_gaps"][1]["after"] == "7:k"
    # the middle 80 % (151–1359 µs) holds the end of the codec kernel (151–280) and idles after it
    assert s["busy_fraction_middle_0.8"] == pytest.approx((280 - 151) / (1359 - 151))
    assert gpu_timeline.summarize([]) == {"events": 0}


# ------------------------------------------------------------------------------ step benchmark
def test_prefill_plans_pack_chunks_up_to_the_token_budget():
    shape = bench_step.BenchShape(batches=(1, 3), contexts=(20,), block_size=4, max_num_batched_tokens=32,
                                  max_model_len=64)
    maker = bench_step.PlanMaker(shape, vocab_size=100)
    plans = maker.prefill_plans(20, released=(0, 1, 2))
    assert len(plans[0].new_requests) == 3 and plans[0].released_slots == (0, 1, 2)
    assert all(not p.new_requests and not p.released_slots for p in plans[1:])
    assert all(sum(c.num_tokens for c in p.chunks) <= 32 for p in plans)
    for slot in range(3):  # each request's chunks cover 0..20 in order; only the last samples
        chunks = [c for p in plans for c in p.chunks if c.slot == slot]
        assert [c.start_pos for c in chunks] == [0] + [sum(c.num_tokens for c in chunks[:i]) for i in range(1, len(chunks))]
        assert sum(c.num_tokens for c in chunks) == 20
        assert [c.samples for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert len(chunks[-1].block_ids) == 5  # 20 tokens / 4 per block
    decode = maker.decode_plan(3, 20)
    assert [(c.slot, c.start_pos, c.num_tokens, len(c.block_ids)) for c in decode.chunks] == [(s, 20, 1, 6) for s in range(3)]


@pytest.fixture(scope="module")
def step_json(tiny_model_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "step.json"
    rc = bench_step.main(["--model", str(tiny_model_dir), "--load-format", "auto", "--device", "cpu",
                          "--batch", "1", "2", "--context", "8", "20", "--iters", "2", "--warmup", "1",
                          "--max-num-batched-tokens", "32", "--max-model-len", "64", "--copy-gib", "0.001",
                          "--mixed-tokens", "6", "--out", str(out), "--log-level", "WARNING"])
    assert rc == 0
    return out


@pytest.mark.parametrize("flag,value", [("--gemm", "cublas"), ("--pdl", "off")])
def test_bench_step_refuses_a_cuda_kernel_choice_on_cpu(tiny_model_dir: Path, capsys, flag, value):
    with pytest.raises(SystemExit):
        bench_step.main(["--model", str(tiny_model_dir), "--device", "cpu", flag, value])
    assert "--gemm and --pdl choose between CUDA kernels" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is absent")
def test_bench_overlap_says_it_needs_cuda(tiny_model_dir: Path, monkeypatch):
    bench_overlap = load_bench("bench_overlap")
    monkeypatch.setattr(sys, "argv", ["bench_overlap.py", "--model", str(tiny_model_dir)])
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_overlap.main()


def test_bench_step_runs_eager_on_cpu(step_json: Path):
    data = json.loads(step_json.read_text())
    rows = data["rows"]
    assert [(r["path"], r["step"], r["context"], r["batch"]) for r in rows] == [
        ("eager", step, context, batch) for context in (8, 20) for step in ("decode", "mixed") for batch in (1, 2)]
    for r in rows:
        assert r["modes"] == ["eager"] and r["iters"] == 2
        assert r["step_ms_median"] > 0 and r["floor_ms"] > 0
        assert r["ratio"] == pytest.approx(r["step_ms_median"] / r["floor_ms"])
        expected_floor = (data["weight_bytes_per_step"] + data["kv_bytes_per_token"] * r["context"] * r["batch"]) \
            / (data["copy_bandwidth_gbps"] * 1e9)
        assert r["floor_ms"] == pytest.approx(expected_floor * 1e3)
    assert data["git_commit"] and data["command"] and data["runners"][0]["step_modes"]["eager"] > 0


def test_bench_step_fp8_kv_cache_floor_counts_one_byte_per_element(step_json: Path, tiny_model_dir: Path,
                                                                  tmp_path: Path):
    """--kv-cache-dtype fp8: the runner stores e4m3 and the floor's KV bytes are a quarter of the
    float32 run's (the tiny model runs float32 on CPU)."""
    out = tmp_path / "step_fp8.json"
    rc = bench_step.main(["--model", str(tiny_model_dir), "--load-format", "auto",
                          "--device", "cpu", "--batch", "2", "--context", "20", "--iters", "1", "--warmup", "0",
                          "--max-num-batched-tokens", "32", "--max-model-len", "64", "--copy-gib", "0.001",
                          "--kv-cache-dtype", "fp8", "--out", str(out), "--log-level", "WARNING"])
    assert rc == 0
    fp8, fp32 = json.loads(out.read_text()), json.loads(step_json.read_text())
    assert (fp8["kv_cache_dtype"], fp8["kv_cache_torch_dtype"]) == ("fp8", "torch.float8_e4m3fn")
    assert (fp32["kv_cache_dtype"], fp32["kv_cache_torch_dtype"]) == ("auto", "torch.float32")
    assert fp8["kv_bytes_per_token"] * 4 == fp32["kv_bytes_per_token"]
    (runner,) = fp8["runners"]
    assert runner["kv_cache_dtype"] == "torch.float8_e4m3fn"
    assert runner["kv_cache_bytes"] == (runner["kv_blocks"] + 1) * 16 * fp8["kv_bytes_per_token"]  # + scratch block
    assert runner["max_memory_allocated_bytes"] is None  # CUDA only
    (row,) = fp8["rows"]
    expected_floor = (fp8["weight_bytes_per_step"] + fp8["kv_bytes_per_token"] * 20 * 2) / (fp8["copy_bandwidth_gbps"] * 1e9)
    assert row["floor_ms"] == pytest.approx(expected_floor * 1e3)


def test_step_weight_bytes_count_backbone_and_audio_table_not_text_embedding(tiny_model_dir: Path):
    from higgs_serve.engine.builder import RuntimeOptions, load_model

    loaded = load_model(str(tiny_model_dir), RuntimeOptions(device="cpu"))
    talker = loaded.talker
    backbone = sum(p.numel() for p in talker.backbone.parameters())
    assert bench_step.step_weight_bytes(loaded) == 4 * (backbone + talker.audio_embedding.numel())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_step_all_graph_paths_on_cuda(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "step.json"
    rc = bench_step.main(["--model", str(tiny_model_dir), "--load-format", "auto", "--device", "cuda",
                          "--batch", "1", "2", "4", "--context", "8", "40", "--iters", "3", "--warmup", "1",
                          "--max-num-batched-tokens", "96", "--max-model-len", "128", "--copy-gib", "0.05",
                          "--mixed-tokens", "10", "--out", str(out), "--log-level", "WARNING"])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["path"] for r in rows} == {"eager", "mlp_graphs", "full_graph", "piecewise"} and len(rows) == 48
    for r in rows:
        # decode steps take the path under test; mixed steps only the piecewise graphs serve
        expected = r["path"] if r["step"] == "decode" or r["path"] == "piecewise" else "eager"
        assert r["modes"] == [expected], r
        assert (r["gpu_ms"] is not None) == (r["path"] == "full_graph" and r["step"] == "decode")


# ------------------------------------------------------------------------------ real server
def _server_stack_missing() -> str | None:
    for name in ("fastapi", "uvicorn", "httpx", "soundfile"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    return None


@pytest.fixture(scope="module")
def serving_json(tiny_model_dir: Path, tmp_path_factory) -> Path:
    missing = _server_stack_missing()
    if missing:
        pytest.skip(f"the HTTP server cannot run here: {missing}")
    out = tmp_path_factory.mktemp("bench") / "serving.json"
    overrides = json.dumps({"0": {"num_gpu_blocks": 64, "max_model_len": 512}})  # small KV: fast start
    cmd = [sys.executable, str(bench_path("bench_serving")), "--model", str(tiny_model_dir), "--device", "cpu",
           "--concurrency", "1", "--num-requests", "2", "--warmup", "0", "--frames", "20", "--label", "tiny",
           "--server-arg=--stage-overrides", f"--server-arg={overrides}", "--ready-timeout", "120",
           "--server-log", str(out.parent / "server.log"), "--out", str(out)]  # the log stays out of /tmp
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| c |" in proc.stdout  # the markdown table
    return out


def test_bench_serving_against_the_real_server(serving_json: Path):
    data = json.loads(serving_json.read_text())
    (level,) = data["levels"]
    assert (level["concurrency"], level["completed"], level["failed"], level["wrong_length"]) == (1, 2, 0, 0)
    assert level["audio_s_total"] == pytest.approx(2 * 20 * 0.04)
    assert 0 < level["ttfa_ms_p50"] < level["latency_s_p50"] * 1e3
    assert level["rtf_mean"] > 0 and level["audio_s_per_s"] > 0
    assert data["server"]["ready_s"] > 0 and data["finished_at"]
    # a CPU server: every step eager (mode none) and op by op (launch tapes are CUDA's)
    assert level["stage0_steps_none"] == level["eager_steps_op_by_op"] == level["engine_steps"] > 0
    assert level["stage0_steps_full"] == level["eager_steps_replay"] == 0


def test_plots_are_written(step_json: Path, serving_json: Path, tmp_path: Path):
    pytest.importorskip("matplotlib")
    plot = load_bench("plot")
    assert plot.main(["--serving", str(serving_json), "--step", str(step_json), "--out-dir", str(tmp_path)]) == 0
    for name in ("serving.png", "step.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _serving_run(path: Path, label: str, deploy_config: str, levels: list[tuple[int, float, float]]) -> str:
    path.write_text(json.dumps({
        "tool": "bench_serving", "label": label, "settings": {"frames": 250, "deploy_config": deploy_config},
        "levels": [{"concurrency": c, "completed": 8, "ttfa_ms_p50": t, "audio_s_per_s": a} for c, t, a in levels]}))
    return str(path)


def test_serving_plot_groups_single_concurrency_files_by_profile(tmp_path: Path):
    pytest.importorskip("matplotlib")
    plot = load_bench("plot")
    fp = "higgs_multimodal_qwen3_full_and_piecewise"
    files = [
        _serving_run(tmp_path / "fp64.json", "fp_c64", fp, [(64, 157.0, 390.0)]),
        _serving_run(tmp_path / "ll.json", "ll_sweep", "higgs_multimodal_qwen3_low_latency",
                     [(1, 80.0, 10.0), (16, 200.0, 117.0), (64, 3900.0, 123.0)]),
        _serving_run(tmp_path / "fp1.json", "fp_c1", fp, [(1, 43.6, 12.8)]),
        _serving_run(tmp_path / "fp16.json", "fp_c16", fp, [(16, 98.0, 151.7)]),
        _serving_run(tmp_path / "fp64b.json", "fp_c64_rerun", fp, [(64, 172.0, 386.5)]),
        _serving_run(tmp_path / "bf.json", "bf", "benchmarks/configs/full_and_piecewise_bf16x3.yaml", [(16, 76.0, 163.5)]),
    ]
    files[1] += ":1,64"  # only those levels of the sweep
    series = dict(plot.serving_series(files, group_by="profile"))
    assert list(series) == ["full_and_piecewise", "low_latency", "full_and_piecewise_bf16x3"]  # first seen
    fp_points = series["full_and_piecewise"]
    assert list(fp_points) == [1, 16, 64]  # sorted by concurrency, whatever the file order
    assert [lv["audio_s_per_s"] for lv in fp_points[64]] == [390.0, 386.5]  # both runs, first given first
    assert [lvs[0]["ttfa_ms_p50"] for lvs in fp_points.values()] == [43.6, 98.0, 157.0]
    assert {c: [lv["audio_s_per_s"] for lv in lvs] for c, lvs in series["low_latency"].items()} == {1: [10.0], 64: [123.0]}
    # the default keeps one line per file, every level
    per_file = plot.serving_series(files[1:3])
    assert [(label, list(points)) for label, points in per_file] == [("ll_sweep", [1, 64]), ("fp_c1", [1])]
    assert [(label, list(pts)) for label, pts in plot.serving_series([files[1][:-5]])] == [("ll_sweep", [1, 16, 64])]
    assert plot.main(["--group-by", "profile", "--serving", *files, "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_continuity_plot_draws_stalls_and_goodput_one_line_per_profile_and_variant(tmp_path: Path):
    pytest.importorskip("matplotlib")
    plot = load_bench("plot")

    def level(c, variant, stalled, good, raw):
        return {"concurrency": c, "variant": variant, "completed": 2 * c, "stalled_share": stalled,
                "goodput_audio_s_per_s": good, "audio_s_per_s": raw, "ttfa_ms_p50": 50.0}

    settings = {"frames": 250, "stall_threshold_ms": 100.0, "ttfa_budget_ms": 1000.0}
    sat = tmp_path / "sat.json"
    sat.write_text(json.dumps({"tool": "bench_serving", "label": "sat", "settings": {**settings, "deploy_config":
                               "benchmarks/configs/saturation_256_bf16x3.yaml"},
                               "levels": [level(1, "pcm", 0.0, 10.0, 10.0), level(256, "pcm", 0.39, 390.0, 632.0),
                                          level(256, "mp3", 0.4, 380.0, 600.0)]}))
    old = _serving_run(tmp_path / "old.json", "ht_old", "higgs_multimodal_qwen3_high_throughput", [(64, 400.0, 300.0)])
    series = dict(plot.serving_series([str(sat), old], group_by="profile"))
    assert list(series) == ["saturation_256_bf16x3", "saturation_256_bf16x3 (mp3)", "high_throughput"]
    assert list(series["saturation_256_bf16x3"]) == [1, 256]
    assert plot.main(["--group-by", "profile", "--continuity", str(sat), old, "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "continuity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):  # a file from before the stall fields has nothing to draw
        plot.plot_continuity([old], tmp_path)


# ------------------------------------------------------------------------------ GEMM sweep space
def test_gemm_sweep_space_past_16_rows_fits_shared_memory_and_holds_the_tuned_buckets():
    bench_gemm = load_bench("bench_gemm")
    from higgs_serve.model.skinny_gemm import TUNED, row_block

    for (n, k), buckets in TUNED.items():
        for max_m, cfg in buckets:
            space = bench_gemm.candidates(n, k, max_m)
            assert cfg in space, (n, k, max_m)  # every tuned entry is reproducible by the tool
            if max_m > 16:
                for c in space:
                    assert c.fits(n, k) and c.num_stages * (c.block_n + row_block(max_m)) * c.block_k * 2 <= 220 * 1024
    n, k = 19456, 2560
    assert all(c.split_k == 1 and c.fits(n // 2, k) for c in bench_gemm.swiglu_candidates(n, k))
    assert dict(TUNED[(n, k)])[64] in bench_gemm.swiglu_candidates(n, k)
