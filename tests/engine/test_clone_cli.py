"""Issue 5 CLI: `encode-voice FILE -o codes.npy` and `synth --ref-audio FILE --ref-text TEXT`.

One subprocess per command on the tiny checkpoint; both are checked against the same work done
in-process (the encoder service, and the engine with that reference).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from engine_harness import ManualEngine, engine_deploy, sampling

from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.voices.reference_encoder import ReferenceEncoder, reference_audio

SR = 24000
REF_TEXT = "The cat sat on the mat."
TEXT = "Hello there."
FRAMES = 10


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", *args],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory):
    t = np.arange(SR) / SR
    audio = (0.3 * np.sin(2 * np.pi * 180.0 * t) + 0.1 * np.sin(2 * np.pi * 530.0 * t)).astype(np.float32)
    path = tmp_path_factory.mktemp("clone_cli") / "voice.flac"
    sf.write(path, audio, SR, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def in_process_codes(tiny_loaded, clip_file):
    return ReferenceEncoder.from_loaded(tiny_loaded).encode_bytes(clip_file.read_bytes())


def test_encode_voice_writes_the_codes(tiny_model_dir, clip_file, in_process_codes, tmp_path):
    out = tmp_path / "codes.npy"
    proc = _cli("encode-voice", str(clip_file), "-o", str(out), "--model", str(tiny_model_dir), "--device", "cpu")
    codes = np.load(out)
    assert codes.dtype == np.int64 and codes.shape == (25, 8)
    np.testing.assert_array_equal(codes, in_process_codes)
    assert "codes [25, 8] int64" in proc.stdout


def test_synth_with_reference_matches_the_engine(tiny_model_dir, tiny_loaded, clip_file, in_process_codes, tmp_path):
    _cli("synth", "--model", str(tiny_model_dir), "--text", TEXT, "--output-dir", str(tmp_path),
         "--ref-audio", str(clip_file), "--ref-text", REF_TEXT, "--temperature", "0", "--seed", "0",
         "--max-new-tokens", str(FRAMES), "--min-new-tokens", str(FRAMES), "--device", "cpu", "--max-num-seqs", "2")
    result = np.load(tmp_path / "0000.npz")
    assert result["frames"].shape == (FRAMES, 8)
    audio, rate = sf.read(tmp_path / "0000.wav")
    assert rate == SR and len(audio) == FRAMES * 960

    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2))
    try:
        request = SpeechRequest("ref", TEXT, sampling(temperature=0.0, seed=0, frames=FRAMES, min_frames=FRAMES),
                                reference=reference_audio(in_process_codes, REF_TEXT))
        (expected,) = engine.generate([request])
        (zero_shot,) = engine.generate([SpeechRequest("zs", TEXT, request.sampling)])
    finally:
        engine.close()
    np.testing.assert_array_equal(result["rows"], expected.rows)
    assert not np.array_equal(result["rows"], zero_shot.rows)  # the reference was really used


def test_synth_with_ref_codes_matches_ref_audio(tiny_model_dir, tiny_loaded, in_process_codes, tmp_path):
    """`synth --ref-codes codes.npy` (encode-voice's output) clones exactly as the engine does with
    those codes; a malformed codes file is a one-line error before the model loads."""
    codes_file = tmp_path / "codes.npy"
    np.save(codes_file, in_process_codes)
    _cli("synth", "--model", str(tiny_model_dir), "--text", TEXT, "--output-dir", str(tmp_path / "out"),
         "--ref-codes", str(codes_file), "--ref-text", REF_TEXT, "--temperature", "0", "--seed", "0",
         "--max-new-tokens", str(FRAMES), "--min-new-tokens", str(FRAMES), "--device", "cpu", "--max-num-seqs", "2")
    result = np.load(tmp_path / "out" / "0000.npz")
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2))
    try:
        request = SpeechRequest("ref", TEXT, sampling(temperature=0.0, seed=0, frames=FRAMES, min_frames=FRAMES),
                                reference=reference_audio(in_process_codes, REF_TEXT))
        (expected,) = engine.generate([request])
    finally:
        engine.close()
    np.testing.assert_array_equal(result["rows"], expected.rows)

    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((4, 7), 3, dtype=np.int64))
    proc = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "synth", "--model", str(tiny_model_dir),
                           "--text", TEXT, "--output-dir", str(tmp_path / "bad"), "--ref-codes", str(bad),
                           "--device", "cpu"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "must have shape [T, 8], got [4, 7]" in proc.stderr
