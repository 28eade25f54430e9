"""benchmarks/codec/bench_codec_snr.py on the tiny model on CPU: the JSON's shape, float32 far above the
90 dB line against float64, bf16x3 above it, bfloat16 far below it, and TF32 said to be absent."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.bench_modules import load_bench

from higgs_serve.audio.formats import float_to_int16
from higgs_serve.model.hf_config import load_model_spec

bench = load_bench("bench_codec_snr")

ROW_KEYS = {"precision", "reference", "scope", "windows", "identical_windows", "snr_mean_db", "snr_min_db",
            "snr_p5_db", "max_err_rel_peak", "snr_vs_float64_min_db", "pcm16_snr_mean_db", "pcm16_snr_min_db",
            "pcm16_full_scale_snr_mean_db", "pcm16_full_scale_snr_min_db", "float32_peak_max", "verdict"}


@pytest.fixture(scope="module")
def snr_run(tiny_model_dir: Path, tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("snr") / "codec_snr.json"
    capture = tmp_path_factory.mktemp("snr") / "stdout.txt"
    with capture.open("w") as f, contextlib.redirect_stdout(f):
        bench.main(["--model", str(tiny_model_dir), "--device", "cpu", "--seeds", "1", "--windows", "2",
                    "--out", str(out)])
    return json.loads(out.read_text()), capture.read_text()


def test_the_json_has_provenance_and_one_row_per_precision(snr_run):
    data, _ = snr_run
    assert {"command", "git_commit", "device", "rows", "by_case"} <= set(data)
    assert "bench_codec_snr.py" in data["command"] and data["torch_device"] == "cpu"
    assert (data["seeds_done"], data["windows"], data["load_format"]) == (1, 2, "dummy")
    rows = {r["precision"]: r for r in data["rows"]}
    assert list(rows) == ["float32", "bf16x3", "tf32", "bfloat16"]
    assert [r["reference"] for r in data["rows"]] == ["float64", "float32", "float32", "float32"]
    windows = 2 + len(bench.CLIP_FRAMES) * bench.CLIPS_PER_LENGTH  # --windows streaming windows + the clips
    for r in data["rows"]:
        assert ROW_KEYS <= set(r) and r["scope"] == "all" and r["windows"] == windows
    # per case: the streaming windows and each clip length, for every precision
    assert [(r["precision"], r["windows"]) for r in data["by_case"]] == [
        (p, n) for p in rows for n in (2, *[bench.CLIPS_PER_LENGTH] * len(bench.CLIP_FRAMES))]


def test_float32_is_far_above_the_line_and_bfloat16_far_below(snr_run):
    rows = {r["precision"]: r for r in snr_run[0]["rows"]}
    f32, x3, bf16 = rows["float32"], rows["bf16x3"], rows["bfloat16"]
    assert f32["snr_min_db"] >= 110 and f32["identical_windows"] == 0 and f32["verdict"] == "transparent"
    assert f32["snr_min_db"] <= f32["snr_p5_db"] <= f32["snr_mean_db"]
    assert f32["max_err_rel_peak"] < 1e-5
    assert x3["snr_min_db"] >= bench.TRANSPARENT_DB and x3["verdict"] == "transparent"
    assert bf16["snr_min_db"] < 60 and bf16["verdict"] == "not transparent" and bf16["max_err_rel_peak"] > 1e-3
    # 16-bit PCM of a full-scale waveform: under the ~98 dB of a sine, well above bfloat16's error
    assert 70 < f32["pcm16_full_scale_snr_min_db"] <= f32["pcm16_full_scale_snr_mean_db"] < 99


def test_tf32_is_reported_as_float32_on_cpu(snr_run):
    data, stdout = snr_run
    tf32 = next(r for r in data["rows"] if r["precision"] == "tf32")
    assert tf32["identical_windows"] == tf32["windows"] and tf32["snr_min_db"] is None
    assert tf32["note"] == bench.TF32_CPU_NOTE and data["notes"] == [bench.TF32_CPU_NOTE]
    assert "no TF32 on CPU" in stdout
    assert stdout.rstrip().splitlines()[-1].startswith("| bfloat16 | float32 | all |")  # the table comes last


def test_seeds_draw_new_dummy_codecs_and_auto_keeps_the_checkpoints(tiny_model_dir: Path):
    spec, cpu = load_model_spec(tiny_model_dir), torch.device("cpu")

    def tensors(load_format: str, seed: int) -> dict[str, torch.Tensor]:
        return bench.codec_tensors(spec, tiny_model_dir, load_format, seed, cpu)

    dummy0, dummy1, auto1 = tensors("dummy", 0), tensors("dummy", 1), tensors("auto", 1)
    name = "acoustic_decoder.conv1.weight"
    assert not torch.equal(dummy0[name], dummy1[name])
    assert all(torch.equal(auto1[n], dummy0[n]) for n in dummy0)  # the tiny checkpoint holds seed 0's codec
    a, b = bench.cases(spec, 0, 3), bench.cases(spec, 1, 3)
    assert a[0].codes.shape == (3, 54, 8) and a[0].keep == (25, 50) and not torch.equal(a[0].codes, b[0].codes)
    assert int(a[0].codes.min()) >= 0 and int(a[0].codes.max()) < spec.codec.codebook_size


def test_pcm16_is_the_servers_int16_conversion():
    audio = np.random.default_rng(0).normal(0.0, 0.6, (3, 2000))  # some samples past ±1: clipped
    assert np.array_equal(bench.pcm16(audio), float_to_int16(audio).astype(np.float64) / 32767.0)
    snr = bench.pcm16_snrs(0.5 * np.sin(np.linspace(0.0, 200 * np.pi, 48_000))[None])
    assert snr["full_scale"][0] == pytest.approx(98.1, abs=1.0)  # 6.02·16 + 1.76 dB for a full-scale sine
    assert snr["sent"][0] == pytest.approx(98.1 - 6.0, abs=1.0)  # half scale: 6 dB less


def test_seeds_and_windows_must_be_positive(tiny_model_dir: Path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", str(tiny_model_dir), "--windows", "0"])
    assert "--seeds and --windows must be >= 1" in capsys.readouterr().err
