#!/usr/bin/env bash
# Download the wheels the GPU machine lacks into .whl/ (git-ignored), for Python 3.12 on
# manylinux x86_64. The GPU image has torch, numpy, pyyaml, safetensors, tokenizers, httpx,
# huggingface-hub, prometheus-client, anyio, h11, click, annotated-doc, matplotlib, uvloop
# (/work/.library/device/KINDS.md); it lacks the HTTP server stack and the audio I/O libraries.
# Versions are the ones pinned in pyproject.toml, and for their own dependencies the ones our
# CPU venv resolved. Never put torch or numpy here: they would shadow the image's CUDA builds.
#
# Usage (from the repo root, on a machine with internet): bash benchmarks/fetch_gpu_wheels.sh [SET...]
# SETs beyond the base (the server stack): av (the compressed formats' encoders, 36 MB; the
# default when no SET is named), perth (the watermark's trained weights, 34 MB), align (the
# word timestamps' aligner, PocketSphinx with its en-US model: a timestamps run, --watermark off). A device call
# carries at most 64 MiB, so av and perth travel in separate calls: a formats run starts its
# server with --watermark off, a watermark run streams pcm (nothing imports av for it).
# On the GPU machine, run_gpu_suite.sh installs them with
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
SETS=("$@")
[ ${#SETS[@]} -eq 0 ] && SETS=(av)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # only this call's sets: what is carried must fit the device call

# compiled wheels: need the platform tags
BINARY=(
  pydantic_core==2.50.4
  cffi==2.1.1
  soundfile==0.14.0
  soxr==1.1.0
  sentencex==1.0.32  # text segmentation (long-form, WebSocket)
  websockets==17.4  # uvicorn's WebSocket protocol; bench_ws_stream.py's client; the front end's relay (cluster/ws_relay.py)
)
declare -A SET_WHEELS=(
  [av]="av==18.1.0"  # the mp3/aac/flac/opus encoders, bounded reference decoding; 36 MB
  [perth]="resemble-perth==1.0.1"  # the watermark's trained model (audio/perth/network.py reads its file); 34 MB
  # 5.0.4: 5.1.1 has no wheel for the GPU image's Python 3.12 (the aligner runs on either: tests/unit/test_alignment.py)
  [align]="pocketsphinx==5.0.4"  # word timestamps' aligner (alignment/; its en-US model is inside the wheel)
)
for set in "${SETS[@]}"; do
  [ -n "${SET_WHEELS[$set]:-}" ] || { echo "fetch_gpu_wheels: unknown set $set (av, perth, align)" >&2; exit 2; }
done
# pure-python wheels
PURE=(
  fastapi==0.163.2
  opentelemetry-api==1.45.2  # fastapi 0.163 imports it at start-up
  starlette==1.10.0
  pydantic==2.14.3
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing_extensions==4.16.0  # pydantic 2.14 needs a recent one; the image's version is unknown
  uvicorn==0.54.0
  python-multipart==0.0.34
  pycparser==3.12
  num2words==0.5.14  # numbers as words for the aligner (its docopt is for its own CLI only)
)

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)

for spec in "${BINARY[@]}"; do
  python3 -m pip download -q "${TARGET[@]}" "${PLATFORMS[@]}" -d "$DEST" "$spec"
done
for set in "${SETS[@]}"; do
  python3 -m pip download -q "${TARGET[@]}" "${PLATFORMS[@]}" -d "$DEST" "${SET_WHEELS[$set]}"
done
for spec in "${PURE[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEST" "$spec"
done

# one version of each package: a stale second wheel would stop the whole install there
dupes=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dupes" ]; then
  echo "fetch_gpu_wheels: more than one wheel of: $dupes (delete the stale ones in $DEST)" >&2
  exit 1
fi
ls -l "$DEST"
du -ch "$DEST"/*.whl | tail -1
