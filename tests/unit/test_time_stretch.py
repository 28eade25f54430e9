import numpy as np
import pytest

from higgs_serve.audio.time_stretch import TimeStretcher, time_stretch

RATE = 24000


def _tone(freq_hz: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def _peak_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.shape[0])))
    return float(np.fft.rfftfreq(audio.shape[0], 1 / RATE)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_length_scales_and_pitch_is_kept(speed):
    audio = _tone(220.0)
    out = time_stretch(audio, speed)
    assert out.dtype == np.float32
    assert out.shape[0] == round(audio.shape[0] / speed)
    assert abs(_peak_hz(out) - 220.0) < 3.0
    middle = out[out.shape[0] // 4: 3 * out.shape[0] // 4]
    # Overlap-add of well-aligned frames keeps the level (no comb-filter dips)
    assert abs(np.sqrt(np.mean(middle ** 2)) - 0.5 / np.sqrt(2)) < 0.02


def test_speed_one_is_identity_and_range_is_enforced():
    audio = _tone(300.0, 0.3)
    assert np.array_equal(time_stretch(audio, 1.0), audio)
    with pytest.raises(ValueError, match="speed must be in"):
        time_stretch(audio, 5.0)
    assert time_stretch(np.zeros(0, np.float32), 2.0).shape == (0,)


@pytest.mark.parametrize("speed", [0.25, 0.8, 1.0, 1.25, 4.0])
def test_piece_by_piece_is_the_whole_stretch_and_holds_little(speed):
    """TimeStretcher fed random pieces gives exactly time_stretch of the whole signal, never
    returns more than round(received / speed), and keeps a few frames, not the signal."""
    rng = np.random.default_rng(7)
    audio = (rng.standard_normal(RATE * 6 + 123) * 0.3).astype(np.float32)
    stretcher = TimeStretcher(speed)
    pieces, received, held = [], 0, 0
    while received < audio.shape[0]:
        size = int(rng.integers(1, 5000))
        pieces.append(stretcher.push(audio[received:received + size]))
        received = min(received + size, audio.shape[0])
        assert sum(p.shape[0] for p in pieces) <= round(received / speed)
        held = max(held, stretcher._input.shape[0] + stretcher._out.shape[0])
    pieces.append(stretcher.close())
    assert np.array_equal(np.concatenate(pieces), time_stretch(audio, speed))
    assert held < 20 * 1024 + 5000 / speed  # a few frames and the last piece, not the signal
