"""Signed provenance on the server's whole-file path (issue 43): what C2PA signing costs and holds,
and that what is signed validates.

Each case runs in a fresh child process (so its peak memory is its own): a file of `seconds` in
`format` at `rate` is built through the server's whole-file path (server/last_mile/audio_file.py:
`collect_file`, the response's `AudioOut`, 1 s chunks of a tone-and-noise signal, spooled to
disk past 1 MiB) with signing on (`FileSigning`, a throwaway EC P-256 chain). Reported per case:
the unsigned and signed sizes, whether it was signed (a file over SIGN_MAX_BYTES is not), the
signing's wall and CPU time, the child's peak RSS before signing and its growth while signing
(ru_maxrss: c2pa reads the whole file into memory to sign it), and the check: c2pa's Reader
(trusting the test root) says Trusted, the action is c2pa.created with the IPTC
trainedAlgorithmicMedia source type, and the signed file decodes to the very samples of the
unsigned one (soundfile for wav/flac, PyAV for mp3).

    PYTHONPATH=src python benchmarks/last_mile/bench_provenance.py --out benchmarks/results/provenance_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import REPO_ROOT, markdown_table, now_iso, provenance, write_json  # noqa: E402

# (format, output rate Hz, seconds): small files (the per-file cost), then growing ones up to and
# past SIGN_MAX_BYTES (64 MiB: WAV 24 kHz ~23 min, 48 kHz ~11.6 min)
CASES = [("wav", 24000, 2), ("mp3", 24000, 2), ("flac", 24000, 2),
         ("wav", 24000, 60), ("mp3", 24000, 60), ("flac", 24000, 60),
         ("wav", 48000, 300), ("mp3", 24000, 1200), ("flac", 48000, 300),
         ("wav", 48000, 690), ("wav", 48000, 720)]


def _second(index: int, rng: np.random.Generator, rate_hz: int = 24000) -> np.ndarray:
    """Second `index` of the signal: [rate] float32, a few tones and quiet noise (a realistic
    FLAC ratio), made a second at a time so the case holds no more than the server would."""
    t = (index * rate_hz + np.arange(rate_hz)) / rate_hz
    tones = sum(0.1 * np.sin(2 * np.pi * f * t) for f in (180.0, 360.0, 1250.0))
    return (tones + 0.02 * rng.standard_normal(rate_hz)).astype(np.float32)


def _decoded(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "mp3":
        import av

        with av.open(io.BytesIO(data)) as container:
            return np.concatenate([f.to_ndarray().ravel() for f in container.decode(audio=0)])
    import soundfile as sf

    return sf.read(io.BytesIO(data), dtype="int16")[0]


def run_case(fmt: str, rate_hz: int, seconds: int) -> dict:
    """One case in this (fresh) process."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    import c2pa
    from support.c2pa_certs import make_chain

    from higgs_serve.audio import provenance as signing_module
    from higgs_serve.audio.provenance import Provenance, SigningIdentity, TRAINED_ALGORITHMIC_MEDIA
    from higgs_serve.server.last_mile.audio_file import FileSigning, collect_file
    from higgs_serve.server.last_mile.audio_out import AudioOut
    from higgs_serve.server.last_mile.audio_workers import AudioWorkers

    chain = make_chain()
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = chain.write(Path(scratch))
        signer = Provenance(SigningIdentity.from_files(cert, key), "bench")
    timing: dict = {}
    original = signing_module.Provenance.sign_file

    def timed_sign_file(self, source, dest, response_format):
        timing["rss_before_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        timing["source_on_disk"] = bool(getattr(source, "_rolled", False))
        wall, cpu = time.perf_counter(), time.thread_time()
        original(self, source, dest, response_format)
        timing["sign_wall_ms"] = 1e3 * (time.perf_counter() - wall)
        timing["sign_cpu_ms"] = 1e3 * (time.thread_time() - cpu)
        timing["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    signing_module.Provenance.sign_file = timed_sign_file
    workers = AudioWorkers(1, "higgs-encode")

    async def build(signing: FileSigning | None):
        async def chunks():
            rng = np.random.default_rng(0)
            for i in range(seconds):
                yield _second(i, rng)

        file = await collect_file(chunks(), AudioOut(fmt, 24000, rate_hz, 1.0, workers, seekable=True), signing)
        try:
            return file.read_all() if file.size_bytes <= (96 << 20) else None, file.signed, file.size_bytes
        finally:
            file.discard()

    # signed first: nothing else of this case is in memory yet when c2pa reads the file
    signed, was_signed, signed_size = asyncio.run(build(FileSigning(signer, fmt, workers)))
    plain, _, plain_size = asyncio.run(build(None))
    workers.shutdown()
    row = {"format": fmt, "rate_hz": rate_hz, "seconds": seconds, "unsigned_mib": plain_size / 2**20,
           "signed_mib": signed_size / 2**20, "signed": was_signed, **timing}
    if was_signed:
        row["rss_growth_mib"] = row["rss_peak_mib"] - row["rss_before_mib"]
        row["rss_growth_per_file_mib"] = row["rss_growth_mib"] / row["unsigned_mib"]
        mime = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac"}[fmt]
        with c2pa.Reader(mime, io.BytesIO(signed), context=chain.trust_context()) as reader:
            state, manifest = reader.get_validation_state(), reader.get_active_manifest()
        actions = [a["data"]["actions"] for a in manifest["assertions"] if a["label"].startswith("c2pa.actions")]
        row["validation_state"] = state
        row["says_trained_algorithmic_media"] = (actions[0][0]["action"] == "c2pa.created" and
                                                 actions[0][0]["digitalSourceType"] == TRAINED_ALGORITHMIC_MEDIA)
        row["same_samples_as_unsigned"] = bool(np.array_equal(_decoded(plain, fmt), _decoded(signed, fmt)))
    else:
        row["same_bytes_as_unsigned"] = signed == plain
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # FORMAT:RATE:SECONDS, the child's
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.case is not None:
        fmt, rate, seconds = args.case.split(":")
        print(json.dumps(run_case(fmt, int(rate), int(seconds))))
        return 0
    started = now_iso()
    rows = []
    for fmt, rate, seconds in CASES:
        child = subprocess.run([sys.executable, __file__, "--case", f"{fmt}:{rate}:{seconds}"],
                               capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if child.returncode != 0:
            raise SystemExit(f"case {fmt}:{rate}:{seconds} failed:\n{child.stderr[-3000:]}")
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    from higgs_serve.audio.provenance import SIGN_MAX_BYTES

    result = {**provenance("bench_provenance", started), "loadavg_end": os.getloadavg(),
              "sign_max_bytes": SIGN_MAX_BYTES, "cases": rows}
    if args.out:
        write_json(args.out, result)
    print(markdown_table(rows, [("format", "format"), ("rate_hz", "Hz"), ("seconds", "s"),
                                ("unsigned_mib", "MiB"), ("signed", "signed"), ("sign_wall_ms", "sign ms"),
                                ("sign_cpu_ms", "CPU ms"), ("rss_growth_mib", "RSS +MiB"),
                                ("validation_state", "reader")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
