"""Does our PerTh (audio/perth/network.py: the wheel's weights on a 24 kHz STFT, no resampling) mark and
detect as resemble-perth's own wrapper does (librosa resampling to 32 kHz, torchaudio STFT)?

On espeak-ng clips (benchmarks/speech_clips.py): each clip marked by both; the SNR between the
two marks (their residuals), each one's SNR against the clip, and each detector's score on the
unmarked clip, on its own mark and on the other's; and the wall time of each embed.

The wrapper cannot be imported next to this project's dependencies (audio/perth/network.py says why), so
its packages go in a side directory named by PERTH_REFERENCE, with torchaudio's C++ extension
removed (the PyPI wheel links CUDA libraries; the transforms perth uses are Python):

  pip install --target /tmp/perth_ref librosa==0.11.0 setuptools==80.9.0
  pip install --target /tmp/perth_ref --no-deps torchaudio==2.11.1 resemble-perth==1.0.1
  rm -rf /tmp/perth_ref/numpy* /tmp/perth_ref/soundfile* /tmp/perth_ref/_soundfile* /tmp/perth_ref/soxr* \
         /tmp/perth_ref/torchaudio/lib/*.so
  PERTH_REFERENCE=/tmp/perth_ref python3 benchmarks/probes/probe_perth_reference.py --clips 20 \
      --out benchmarks/results/watermark_perth_reference.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import mean, now_iso, provenance, write_json  # noqa: E402
from speech_clips import SAMPLE_RATE_HZ, make_clips  # noqa: E402

from higgs_serve.audio.watermark import embed, load_watermarker  # noqa: E402


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - other) ** 2.0)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clips", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    side = os.environ.get("PERTH_REFERENCE")
    if not side:
        raise SystemExit("set PERTH_REFERENCE to the directory holding resemble-perth's wrapper and its "
                         "dependencies (see this file's docstring)")
    sys.path.append(side)
    warnings.simplefilter("ignore")
    import perth

    if perth.PerthImplicitWatermarker is None:
        raise SystemExit("resemble-perth's wrapper did not import (its PerthImplicitWatermarker is None)")
    started = now_iso()
    reference = perth.PerthImplicitWatermarker()
    ours = load_watermarker("perth", "cpu")
    rows = []
    for clip in make_clips(args.clips):
        x = clip.audio
        t0 = time.perf_counter()
        theirs_marked = reference.apply_watermark(x, SAMPLE_RATE_HZ).astype(np.float32)
        t1 = time.perf_counter()
        ours_marked = embed(ours, x)
        t2 = time.perf_counter()
        # the wrapper's resampling round trip may drop a few samples at the end: compare the common part
        n = min(x.size, theirs_marked.size)
        x, theirs_marked, ours_marked = x[:n], theirs_marked[:n], ours_marked[:n]

        def ref_score(audio):
            return float(np.asarray(reference.get_watermark(audio, SAMPLE_RATE_HZ, round=False)).item())

        rows.append({
            "seconds": clip.seconds, "voice": clip.voice,
            "snr_db_theirs": snr_db(x, theirs_marked), "snr_db_ours": snr_db(x, ours_marked),
            "marks_agree_snr_db": snr_db(theirs_marked - x, ours_marked - x),
            "their_detector": {"unmarked": ref_score(x), "theirs": ref_score(theirs_marked), "ours": ref_score(ours_marked)},
            "our_detector": {"unmarked": ours.score(x), "theirs": ours.score(theirs_marked), "ours": ours.score(ours_marked)},
            "embed_s_theirs": t1 - t0, "embed_s_ours": t2 - t1,
        })
        print(rows[-1], flush=True)
    audio_s = sum(r["seconds"] for r in rows)
    result = {
        **provenance("probe_perth_reference", started), "loadavg": os.getloadavg(), "clips": len(rows),
        "marks_agree_snr_db_min": min(r["marks_agree_snr_db"] for r in rows),
        "marks_agree_snr_db_mean": mean([r["marks_agree_snr_db"] for r in rows]),
        "score_max_abs_difference": max(abs(r["their_detector"][k] - r["our_detector"][k])
                                        for r in rows for k in ("unmarked", "theirs", "ours")),
        "embed_ms_per_audio_s_theirs": 1e3 * sum(r["embed_s_theirs"] for r in rows[1:]) / (audio_s - rows[0]["seconds"]),
        "embed_ms_per_audio_s_ours": 1e3 * sum(r["embed_s_ours"] for r in rows[1:]) / (audio_s - rows[0]["seconds"]),
        "note": "embed times leave out the first clip (the wrapper's first call warms librosa up)",
        "rows": rows,
    }
    if args.out:
        write_json(args.out, result)
    print({k: v for k, v in result.items() if k != "rows"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
