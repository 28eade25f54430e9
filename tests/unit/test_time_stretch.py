import numpy as np
import pytest

from higgs_serve.audio.time_stretch import time_stretch

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
