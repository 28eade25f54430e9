"""Detection's memory does not grow with the decoded length (issue 52): a 180 KB FLAC of 299 s of
silence at 192 kHz cost ~240 MB per detection, decoded whole at 192 kHz and scored whole. Now it
is decoded block by block, resampled to 24 kHz and scored as it arrives (audio/watermark_detect.py,
audio/perth/score.py). Measured in a fresh process (peak RSS), past the model's own load."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import io, resource, numpy as np, soundfile as sf
    from higgs_serve.audio.watermark_detect import LazyDetector

    def flac(seconds, rate):
        buffer = io.BytesIO()
        sf.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="FLAC", subtype="PCM_16")
        return buffer.getvalue()

    detector = LazyDetector()
    small, hostile = flac(3, 192_000), flac(299, 192_000)
    detector.detect_file(small, "file")  # the model loads, every code path runs once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    found = detector.detect_file(io.BytesIO(hostile), "file")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(len(hostile), (after - before) / 1024, found.verdict)
""")


def test_a_long_high_rate_file_is_detected_in_bounded_memory():
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                              **{k: v for k, v in __import__("os").environ.items() if k.startswith(("PYTHON", "HOME"))}})
    assert run.returncode == 0, run.stderr
    size, growth_mb, verdict = run.stdout.split()
    assert int(size) < 400_000  # a small file on the wire ...
    assert float(growth_mb) < 50, growth_mb  # ... 299 s at 192 kHz (230 MB as float32) never held
    assert verdict == "inconclusive"  # silence: nothing to judge
