#!/usr/bin/env bash
# The GPU run, one script: `bash benchmarks/run_gpu_suite.sh STAGE...` from the repo root on the
# H200 machine (no network; only this repo is there; carry .whl, see fetch_gpu_wheels.sh).
#
# Issues 53-55 (continuity and goodput, what is on by default, the default profile against the
# best), on one H100: three device calls of <= 9 min, each ratio an acceptance asks for within
# one call. The mark needs no wheel of its own on --load-format dummy (random weights for it too).
#   1. bash benchmarks/fetch_gpu_wheels.sh av             (here, with network)
#      run(carry=[".whl"], timeout_s=600, command=
#        "HIGGS_GIT_COMMIT=<short sha> bash benchmarks/run_gpu_suite.sh goodput_sat")
#   2. bash benchmarks/fetch_gpu_wheels.sh align           (no av: the call's 64 MiB)
#      ... run_gpu_suite.sh goodput_ht
#   3. bash benchmarks/fetch_gpu_wheels.sh base ... run_gpu_suite.sh goodput_profiles tests
#   CPU dry run first (tiny model, 25-frame streams, every level capped at 2; JSON not kept):
#      WHEELS=none DEVICE=cpu LOAD_FORMAT=auto MODEL=<tiny model dir> OUT=/tmp/dry FRAMES=25 \
#      LEVEL_CAP=2 bash benchmarks/run_gpu_suite.sh goodput_sat goodput_ht goodput_profiles plots
#
# Stages (run in the order given; each under `timeout`, the suite goes on after a failure):
#   tests       pytest tests/gpu + the benchmark tools' tests           est. 1-3 min
#   tapes       launch tapes (issue 32): their GPU tests, bench_step      est. 3-5 min
#               MLP graphs with tapes on/off beside the full graph (decode
#               steps, and mixed steps of B decodes + a 64-token chunk), bench_launch
#   step        bench_step: eager, MLP graphs, full decode graph,       est. 3-5 min
#               piecewise (pass --mixed-tokens 64 in STEP_ARGS for mixed steps too),
#               B = 1..64, L = 128/1024/4096, 50 steps each
#   serving     serving_ll, serving_ht, serving_fp                      est. 3-5 min
#   serving_ll  bench_serving, low-latency profile, c = 1..64           est. 2-3 min (limit 255 s)
#   serving_ht  bench_serving, high-throughput profile, c = 1..64       est. 2-4 min (limit 255 s)
#   serving_fp  bench_serving, full_and_piecewise profile, c = 1..64    est. 1-2 min (limit 255 s)
#   plots       PNGs from whatever JSON is in $OUT                      est. 10 s
#   longform    bench_seam (joins with and without the seam ramp), then  est. 3-5 min
#               bench_ws_stream against a server (WebSocket TTFA at LLM text speed, c = 1/4/16)
#   codec_eager profile_engine, low-latency / high-throughput / full_and_piecewise est. 3-4 min
#               at B = 4 and 16 (codec real and stubbed, GPU timeline): what the eager
#               codec of the two user profiles costs per call against the codec graphs; for
#               low latency also the codec at Stage 0's stream priority, and a 0.5 ms GIL interval
#   scaleout_mps  tests/gpu/test_mps_gpu.py (the private daemon serves two    est. 4-6 min
#               CUDA processes), then bench_scaleout: one engine against two, then three,
#               engines sharing GPU 0 under MPS (serve --devices 0,0 --mps), saturation
#               profile (bf16x3 codec, 256 sequences), c = 128/256, 512 requests a level
#   lm_formats_ht   issue 46 (the last mile): bench_serving, the default profile       est. 3-4 min
#               (high throughput; --max-queue 256 so c = 256 queues instead of 429), c = 1/64/256,
#               pcm, mp3, opus and aac streamed as OpenAI clients ask (no `stream` field), each
#               level once per format on one server; server CPU cores from /proc
#   lm_formats_best the same on the best profile (full_and_piecewise at 256 sequences, est. 3-4 min
#               bf16x3 codec: benchmarks/configs/saturation_256_bf16x3.yaml)
#   lm_timestamps issue 42: word timestamps' cost on the GPU, two bench_serving runs on   est. 4-6 min
#               the default profile, SSE streams (a raw stream asking for timestamps waits), pcm,
#               c = 1/64 (LM_TS_LEVELS): lm_timestamps_off then lm_timestamps_on; compare TTFA
#               p50 (the ratio on/off), audio s/s, the words' lag and the aligner processes' CPU
#               per audio second (default --alignment-workers: a quarter of the cores, at most 4);
#               the mark off, so the wheels are the base set plus `align` (fetch_gpu_wheels.sh align)
#   lm_frontend issue 46 item 4: the same default-profile server behind the data-parallel  est. 2 min
#               front end (serve --devices 0: one replica), pcm, c = 64/256; bench_serving's
#               server CPU is then the front end's own (the replica is its child, not counted)
#   lm_watermark issue 46 item 2: the default profile with the mark on, then off, pcm,    est. 6 min
#               c = 1/64/256 (levels carry the mark stage's busy ms per audio s), then
#               bench_watermark's cost section on this device; carry `fetch_gpu_wheels.sh perth`
#   goodput_*   issues 53-55: bench_serving, 10 s pcm streams, closed loop, each stage one server
#               start sweeping its request variants (--variants FORMAT[+sse][+words]@C,...) and
#               reporting per level the stalled share, goodput, refusals and the server's playback
#               series. Server start ~15-50 s on an H100 (ready_s in the JSON; graph capture
#               included), a level of 2c requests 3-10 s (c = 256: ~10 s a variant):
#     goodput_sat_on    saturation config (benchmarks/configs/saturation_256_bf16x3.yaml), mark on,
#                       pcm c = 1/16/64/128/256                              est. 1.5 min (limit 170 s)
#     goodput_sat_nodl  the same with the deadline policy off (issue 53's before on this tree),
#                       pcm c = 1/64/256                                      est. 1-1.5 min (limit 130 s)
#     goodput_sat_off   saturation, mark off, pcm c = 1/64/256, then mp3/opus/aac at 256
#                       (issue 54's formats against pcm; needs av)            est. 2 min (limit 170 s)
#     goodput_ht_on     default profile (high throughput), mark on, pcm 1/16/64  est. 1 min (limit 120 s)
#     goodput_ht_nodl   the same with the deadline policy off, pcm c = 1/64  est. 1 min (limit 110 s)
#     goodput_ht_words  default profile, mark off, pcm c = 1/16/64, then SSE at c = 64 with
#                       word timestamps off and on (needs align)              est. 1.5-2 min (limit 150 s)
#     goodput_ht_cg     the default profile with codec graphs and left context 10
#                       (configs/high_throughput_codec_graphs.yaml), mark off, pcm 1/16/64 (issue 55)
#     goodput_fp        full_and_piecewise (the best profile), mark off, pcm c = 1/16/64
#     goodput_ll        low latency, mark off, pcm c = 1/4; goodput_ll_cg: with codec graphs
#   admit       issue 59: the default profile (pcm 1/16/64/128) and the saturation config (pcm
#               1/64/128/256/512, queue 512) with the deadline policy on and off, the mark on,
#               then admit_guard: policy_guard.py on each pair (exit 1 when the default serves
#               less than the policy off)                                   est. 5-8 min (limits 520 s)
#     goodput_sat = sat_on sat_nodl sat_off; goodput_ht = ht_on ht_nodl ht_words ht_cg;
#     goodput_profiles = fp ll ll_cg
#               LEVEL_CAP=N caps every level at N (a CPU dry run of the script).
#   codec_snr   bench_codec_snr: SNR of the bf16x3/tf32/bfloat16 codec    est. 1-2 min (limit 170 s)
#               against float32 and of float32 against float64, 4 random
#               codecs x (64 streaming windows + 4 whole clips)
# A device call is limited to 10 min (keep a margin: <= 9): e.g. `tests step`, then
# `serving plots` (or `serving_ll` and `serving_ht plots` in separate calls if serving runs long).
#
# Estimates (H200, 4B geometry, dummy weights): torch import + load ~20-30 s (random weights are
# generated on the GPU; the codec too); MLP graph capture 7 sizes x 36 layers ~10-20 s, full
# decode graph 7 sizes ~5-15 s; decode step ~10-30 ms eager, ~2-5 ms as a full graph at B=1.
#  - step: per path ~336k prefill tokens (64 requests x (128 + 1024 + 4096)) ~10-20 s, plus
#    21 (B, L) points x 53 steps x ~5-40 ms ~ 10-45 s, plus the build/capture: ~1-1.5 min a path.
#  - serving: a server start ~40-70 s (load, KV cache, capture, warm-up); 250 frames (10 s of
#    audio) per request take 250 steps: ~2-8 s a request; levels c = 1..64 with 2c requests each
#    run 2 "rounds" each, so ~14 request latencies ~ 30-110 s per profile after the start. The
#    low-latency profile has max_num_seqs 16, so at c = 32 / 64 requests queue (2c requests = 8 rounds of 16 at c = 64).
#    --max-minutes makes bench_serving start no new level late in the budget, and it rewrites
#    its JSON after every level, so a cut-short run still returns what it measured.
#
# Output in $OUT (at most 8 files come back): gpu_suite.log (everything, appended), step.json,
# serving_ll.json, serving_ht.json, serving_fp.json, serving.png, step.png (codec_snr: codec_snr.json;
# goodput_*: goodput_<stage>.json, and continuity.png from the plots stage).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
MODEL=${MODEL:-/tmp/higgs-4b}
FRAMES=${FRAMES:-250}
CONCURRENCY=${CONCURRENCY:-"1 2 4 8 16 32 64"}
# for a CPU dry run of the script itself: WHEELS=none DEVICE=cpu LOAD_FORMAT=auto MODEL=<tiny model dir>
# STEP_ARGS="--batch 1 2 --context 8 --iters 2 --copy-gib 0.01 --max-model-len 64"
WHEELS=${WHEELS:-.whl}
DEVICE=${DEVICE:-cuda}
LOAD_FORMAT=${LOAD_FORMAT:-dummy}
STEP_ARGS=${STEP_ARGS:-}
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (harmless on one GPU)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# run NAME LIMIT_S CMD...: one stage under timeout, its output appended to the log
run() {
  local name=$1 limit=$2
  shift 2
  log "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=20 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "=== $name: rc=$rc after $((SECONDS - t0)) s"
  return $rc
}

setup() {
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
      >>"$LOG" 2>&1 || { log "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:src
  else
    log "no wheels in $WHEELS/: the HTTP server stack may be missing (see benchmarks/fetch_gpu_wheels.sh)"
    export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
  fi
  { nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
  } >>"$LOG" 2>&1
  if [ ! -f "$MODEL/config.json" ]; then
    python3 -m higgs_serve.cli make-tiny-model "$MODEL" --preset 4b --config-only >>"$LOG" 2>&1 \
      || { log "could not write the 4B config to $MODEL"; exit 1; }
  fi
}

stage_tests() {
  # test_bench_tools: bench_step on all three graph paths (tiny model) + a real-server bench run
  # test_mps_gpu runs in the scaleout_mps stage: a container that cannot run MPS stops nothing else
  run tests 540 python3 -m pytest -q -x tests/gpu tests/unit/test_bench_tools.py tests/unit/test_bench_serving_math.py \
    -p no:cacheprovider \
    --ignore=tests/gpu/test_mps_gpu.py
}

stage_step() {
  # shellcheck disable=SC2086  # STEP_ARGS is a list of options
  run step 540 python3 benchmarks/step/bench_step.py --model "$MODEL" --load-format "$LOAD_FORMAT" --device "$DEVICE" \
    --out "$OUT/step.json" $STEP_ARGS
}

# serving_profile LABEL PROFILE LIMIT_S
serving_profile() {
  local label=$1 profile=$2 limit=$3
  local budget_min
  budget_min=$(awk "BEGIN {print ($limit - 75) / 60}")  # no new level in the last 75 s of the limit
  # shellcheck disable=SC2086  # CONCURRENCY is a list of numbers
  run "$label" "$limit" python3 benchmarks/serving/bench_serving.py --model "$MODEL" --load-format "$LOAD_FORMAT" \
    --device "$DEVICE" --deploy-config "$profile" --label "$label" --concurrency $CONCURRENCY --frames "$FRAMES" --warmup 2 \
    --max-minutes "$budget_min" --server-log "/tmp/server_$label.log" --out "$OUT/$label.json"
  local rc=$?
  { echo "--- last lines of the $label server log"; tail -n 40 "/tmp/server_$label.log"; } >>"$LOG" 2>&1
  return $rc
}

stage_tapes() {
  # issue 32's launch tapes: their GPU tests, the MLP-graph step with tapes on and off beside the
  # full decode graph in one process, and host time per launch (op wrappers against tape entries)
  run tapes_tests 240 python3 -m pytest -q tests/gpu/test_launch_tapes.py tests/gpu/test_graph_paths.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_launcher_gpu.py -p no:cacheprovider
  run tapes_step 300 python3 benchmarks/step/bench_step.py --model "$MODEL" --load-format "$LOAD_FORMAT" --device "$DEVICE" \
    --paths mlp_graphs full_graph --tapes on off --batch 1 16 32 64 --context 128 --iters 30 --mixed-tokens 64 \
    --out "$OUT/step_tapes.json"
  run tapes_launch 120 sh -c "python3 benchmarks/step/bench_launch.py > '$OUT/launch_overhead.txt'"
}

stage_serving_ll() { serving_profile serving_ll higgs_multimodal_qwen3_low_latency 255; }
stage_serving_ht() { serving_profile serving_ht higgs_multimodal_qwen3_high_throughput 255; }
stage_serving_fp() { serving_profile serving_fp higgs_multimodal_qwen3_full_and_piecewise 255; }
stage_serving() { stage_serving_ll; stage_serving_ht; stage_serving_fp; }

stage_codec_eager() {
  # issue 32 point 3: at c = 4-16 the two user profiles' eager codec was busy 46-57 % of the time
  # against 9-19 % for the codec graphs (serving_*_264330c / _tapes_poolfix JSON): per-call latency,
  # windows per call and GPU timelines in the engine loop, codec stubbed beside, settle why
  # The low-latency profile also runs the two experiments that tell the explanations apart: the
  # codec's stream at Stage 0's priority, and a 0.5 ms GIL switch interval.
  local profile codecs
  for profile in low_latency high_throughput full_and_piecewise; do
    codecs="real stubbed"
    [ "$profile" = low_latency ] && codecs="real real-high-priority stubbed"
    # shellcheck disable=SC2086  # codecs is a list
    run "codec_eager_$profile" 200 python3 benchmarks/step/profile_engine.py --model "$MODEL" --load-format "$LOAD_FORMAT" \
      --device "$DEVICE" --deploy-config "higgs_multimodal_qwen3_$profile" --batch 4 16 --frames "$FRAMES" --gpu-trace \
      --codec $codecs --out "$OUT/codec_eager_$profile.json"
  done
  run codec_eager_low_latency_gil 120 python3 benchmarks/step/profile_engine.py --model "$MODEL" \
    --load-format "$LOAD_FORMAT" --device "$DEVICE" --deploy-config higgs_multimodal_qwen3_low_latency --batch 4 16 \
    --frames "$FRAMES" --codec real --switch-interval-ms 0.5 --out "$OUT/codec_eager_low_latency_gil0p5ms.json"
}

stage_scaleout_mps() {
  # issue 33 point 5: engines sharing one GPU under MPS (cluster/mps.py) against one engine, each
  # side with the same per-engine config; the JSON records whether nvidia-smi saw the MPS server
  local n devices config
  run mps_tests 120 python3 -m pytest -q tests/gpu/test_mps_gpu.py -p no:cacheprovider
  for n in 2 3; do
    devices=0,0 config=benchmarks/configs/saturation_256_bf16x3_shared_gpu.yaml
    [ "$n" = 3 ] && devices=0,0,0 config=benchmarks/configs/saturation_256_bf16x3_thirds.yaml
    run "scaleout_mps$n" 280 python3 benchmarks/cluster/bench_scaleout.py --model "$MODEL" --load-format "$LOAD_FORMAT" \
      --devices "$devices" --mps \
      --deploy-config "$config" --concurrency 128 256 --num-requests 512 --frames "$FRAMES" --parts scaling \
      --ready-timeout 200 --out "$OUT/scaleout_mps$n.json"
  done
}

stage_longform() {
  run seam 240 python3 benchmarks/codec/bench_seam.py --model "$MODEL" --load-format "$LOAD_FORMAT" --device "$DEVICE" \
    --segments 20 --frames 100 --out "$OUT/seam.json"
  local port pid i rc
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  python3 -m higgs_serve.cli --log-level WARNING serve "$MODEL" --load-format "$LOAD_FORMAT" --device "$DEVICE" \
    --host 127.0.0.1 --port $port >/tmp/server_ws.log 2>&1 &
  pid=$!
  for i in $(seq 1 240); do
    python3 -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$port/ready').status_code != 200)" \
      2>/dev/null && break
    sleep 1
  done
  run ws_stream 300 python3 benchmarks/serving/bench_ws_stream.py --url "ws://127.0.0.1:$port" --sessions 6 \
    --concurrency 1 4 16 --frames 75 --out "$OUT/ws_stream.json"
  rc=$?
  kill -INT "$pid"
  wait "$pid"
  { echo "--- last lines of the ws server log"; tail -n 20 /tmp/server_ws.log; } >>"$LOG" 2>&1
  return $rc
}

# lm_serving LABEL LIMIT_S ARGS...: bench_serving (10 s streams, closed loop) for issue 46
lm_serving() {
  local label=$1 limit=$2
  shift 2
  local budget_min
  budget_min=$(awk "BEGIN {print ($limit - 60) / 60}")  # no new level in the last minute
  run "$label" "$limit" python3 benchmarks/serving/bench_serving.py --model "$MODEL" --load-format "$LOAD_FORMAT" \
    --device "$DEVICE" --label "$label" --frames "$FRAMES" --warmup 2 --max-minutes "$budget_min" \
    --server-log "/tmp/server_$label.log" --server-log-level INFO --out "$OUT/$label.json" "$@"
  local rc=$?
  { echo "--- the $label server's deadline policy (start-up timings, stream limit moves)"
    grep -E "timed for the deadline|stream limit" "/tmp/server_$label.log" | tail -n 60
    echo "--- last lines of the $label server log"; grep -v '"POST /v1/audio/speech' "/tmp/server_$label.log" | tail -n 30
  } >>"$LOG" 2>&1
  return $rc
}

LM_LEVELS=${LM_LEVELS:-"1 64 256"}
stage_lm_formats_ht() {
  # shellcheck disable=SC2086  # LM_LEVELS is a list
  lm_serving lm_formats_ht 290 --deploy-config higgs_multimodal_qwen3_high_throughput --concurrency $LM_LEVELS \
    --response-format pcm mp3 opus aac --no-stream-field --server-arg=--max-queue --server-arg=256 \
    --watermark off  # as the first run (before the mark existed); carry the av wheel set, not perth
}
stage_lm_formats_best() {
  # shellcheck disable=SC2086
  lm_serving lm_formats_best 290 --deploy-config benchmarks/configs/saturation_256_bf16x3.yaml \
    --concurrency $LM_LEVELS --response-format pcm mp3 opus aac --no-stream-field \
    --server-arg=--max-queue --server-arg=256 --watermark off  # as lm_formats_ht
}
LM_TS_LEVELS=${LM_TS_LEVELS:-"1 64"}
stage_lm_timestamps() {
  local rc=0 state
  for state in off on; do
    # shellcheck disable=SC2086  # LM_TS_LEVELS is a list
    lm_serving "lm_timestamps_$state" 200 --deploy-config higgs_multimodal_qwen3_high_throughput \
      --concurrency $LM_TS_LEVELS --response-format pcm --stream-format sse --word-timestamps "$state" \
      --watermark off --server-arg=--max-queue --server-arg=256 || rc=1
  done
  return $rc
}
stage_lm_frontend() {
  local replicas=(--server-arg=--devices --server-arg=0)  # one replica on GPU 0
  [ "$DEVICE" = cpu ] && replicas=(--server-arg=--data-parallel-size --server-arg=1)
  lm_serving lm_frontend 200 --deploy-config higgs_multimodal_qwen3_high_throughput --concurrency 64 256 \
    --response-format pcm --no-stream-field --server-arg=--max-queue --server-arg=256 "${replicas[@]}"
}

stage_lm_watermark() {
  # the mark on, then off, on the same profile and levels (pcm: no encoder in the way); then
  # the mark's own cost on this GPU (carry the perth wheel set: fetch_gpu_wheels.sh perth)
  local common=(--deploy-config higgs_multimodal_qwen3_high_throughput --response-format pcm
                --no-stream-field --server-arg=--max-queue --server-arg=256)
  # shellcheck disable=SC2086
  lm_serving lm_watermark_on 200 "${common[@]}" --concurrency $LM_LEVELS --watermark on
  # shellcheck disable=SC2086
  lm_serving lm_watermark_off 200 "${common[@]}" --concurrency $LM_LEVELS --watermark off
  run lm_watermark_cost 100 python3 benchmarks/last_mile/bench_watermark.py --device "$DEVICE" --sections cost \
    --repeats 20 --out "$OUT/lm_watermark_cost.json"
}

# Issues 53-55: continuity, goodput and refusals at every level (bench_serving's playback fields)
SATURATION=benchmarks/configs/saturation_256_bf16x3.yaml
# issue 53's before on today's code: the same configs with Stage 0's deadline policy off
SATURATION_NODL=benchmarks/configs/saturation_256_bf16x3_no_deadlines.yaml
HT_NODL=benchmarks/configs/high_throughput_no_deadlines.yaml
LEVEL_CAP=${LEVEL_CAP:-}
# cap_levels SPEC...: the variants with every level above LEVEL_CAP lowered to it (once each)
cap_levels() {
  local spec
  for spec in "$@"; do
    if [ -n "$LEVEL_CAP" ] && [[ $spec == *@* ]]; then
      spec="${spec%%@*}@$(tr ',' '\n' <<<"${spec#*@}" | awk -v cap="$LEVEL_CAP" \
        '{ c = ($1 < cap ? $1 : cap); if (!seen[c]++) printf "%s%s", (n++ ? "," : ""), c }')"
    fi
    printf '%s\n' "$spec"
  done
}
# goodput LABEL LIMIT_S DEPLOY_CONFIG MARK VARIANT...: one server start, each variant at its levels
goodput() {
  local label=$1 limit=$2 config=$3 mark=$4
  shift 4
  local specs=() extra=()
  for arg in "$@"; do [[ $arg == --* ]] && extra+=("$arg") || specs+=("$arg"); done
  local variants
  mapfile -t variants < <(cap_levels "${specs[@]}")
  lm_serving "$label" "$limit" --deploy-config "$config" --watermark "$mark" "${extra[@]}" --variants "${variants[@]}"
}
stage_goodput_sat_on() { goodput goodput_sat_on 170 "$SATURATION" on pcm@1,16,64,128,256; }
stage_goodput_sat_nodl() { goodput goodput_sat_nodl 130 "$SATURATION_NODL" on pcm@1,64,256; }
stage_goodput_sat_off() { goodput goodput_sat_off 170 "$SATURATION" off pcm@1,64,256 mp3@256 opus@256 aac@256; }
stage_goodput_ht_on() { goodput goodput_ht_on 120 higgs_multimodal_qwen3_high_throughput on pcm@1,16,64; }
stage_goodput_ht_nodl() { goodput goodput_ht_nodl 110 "$HT_NODL" on pcm@1,64; }
stage_goodput_ht_words() {
  # the mark off: the default profile's side of goodput_ht_on (issue 54's ratio) and of the
  # profile stages (issue 55's), then SSE at c = 64 with word timestamps off and on
  goodput goodput_ht_words 150 higgs_multimodal_qwen3_high_throughput off pcm@1,16,64 pcm+sse@64 pcm+sse+words@64
}
stage_goodput_ht_cg() { goodput goodput_ht_cg 120 benchmarks/configs/high_throughput_codec_graphs.yaml off pcm@1,16,64; }
stage_goodput_fp() { goodput goodput_fp 120 higgs_multimodal_qwen3_full_and_piecewise off pcm@1,16,64; }
stage_goodput_ll() { goodput goodput_ll 100 higgs_multimodal_qwen3_low_latency off pcm@1,4; }
stage_goodput_ll_cg() { goodput goodput_ll_cg 100 benchmarks/configs/low_latency_codec_graphs.yaml off pcm@1,4; }
# Issue 59: the admission measured at start-up and steered by the leads, beside the policy off on
# one machine, each level reached from idle; the mark on (random weights on dummy); a queue long
# enough that the policy off queues at c = 512 instead of answering 429
ADMIT_QUEUE=(--server-arg=--max-queue --server-arg=512)
stage_admit_ht_on() { goodput admit_ht_on 120 higgs_multimodal_qwen3_high_throughput on pcm@1,16,64,128; }
stage_admit_ht_off() { goodput admit_ht_off 110 "$HT_NODL" on pcm@1,16,64,128; }
stage_admit_sat_on() { goodput admit_sat_on 150 "$SATURATION" on pcm@1,64,128,256,512 "${ADMIT_QUEUE[@]}"; }
stage_admit_sat_off() { goodput admit_sat_off 140 "$SATURATION_NODL" on pcm@1,64,128,256,512 "${ADMIT_QUEUE[@]}"; }
# the guard: the policy against itself off, level by level (exit 1 when the default serves less)
stage_admit_guard() {
  run admit_guard_ht 30 python3 benchmarks/serving/policy_guard.py --on "$OUT/admit_ht_on.json" \
    --off "$OUT/admit_ht_off.json" --out "$OUT/admit_guard_ht.json"
  local rc=$?
  run admit_guard_sat 30 python3 benchmarks/serving/policy_guard.py --on "$OUT/admit_sat_on.json" \
    --off "$OUT/admit_sat_off.json" --out "$OUT/admit_guard_sat.json" || rc=1
  return $rc
}
stage_admit() { stages admit_ht_on admit_ht_off admit_sat_on admit_sat_off admit_guard; }  # base
# groups, one device call each (each under 9 min; the wheels each needs):
stage_goodput_sat() { stages goodput_sat_on goodput_sat_nodl goodput_sat_off; }   # base + av
stage_goodput_ht() { stages goodput_ht_on goodput_ht_nodl goodput_ht_words goodput_ht_cg; }  # base + align
stage_goodput_profiles() { stages goodput_fp goodput_ll goodput_ll_cg; }   # base
# stages NAME...: each in turn, all of them whatever one returns; 1 if any failed
stages() {
  local rc=0 stage
  for stage in "$@"; do "stage_$stage" || rc=1; done
  return $rc
}

stage_codec_snr() {
  # the JSON is rewritten after every seed: a run cut by the limit keeps the seeds it finished
  run codec_snr 170 python3 benchmarks/codec/bench_codec_snr.py --model "$MODEL" --load-format "$LOAD_FORMAT" \
    --device "$DEVICE" --out "$OUT/codec_snr.json"
}

stage_plots() {
  local serving=()
  for f in "$OUT"/serving_ll.json "$OUT"/serving_ht.json "$OUT"/serving_fp.json; do [ -f "$f" ] && serving+=("$f"); done
  local args=()
  [ ${#serving[@]} -gt 0 ] && args+=(--serving "${serving[@]}")
  [ -f "$OUT/step.json" ] && args+=(--step "$OUT/step.json")
  local goodput=("$OUT"/goodput_*.json)
  [ -f "${goodput[0]}" ] && args+=(--group-by file --continuity "${goodput[@]}")
  if [ ${#args[@]} -eq 0 ]; then
    log "plots: no JSON in $OUT"
    return 1
  fi
  run plots 120 python3 benchmarks/plot.py "${args[@]}" --out-dir "$OUT"
}

if [ $# -eq 0 ]; then
  echo "usage: bash benchmarks/run_gpu_suite.sh {tests|step|tapes|serving|serving_ll|serving_ht|serving_fp|codec_eager|scaleout_mps|longform|codec_snr|plots|lm_formats_ht|lm_formats_best|lm_frontend|lm_watermark|lm_timestamps|goodput_sat|goodput_ht|goodput_profiles|goodput_sat_on|goodput_sat_nodl|goodput_sat_off|goodput_ht_on|goodput_ht_nodl|goodput_ht_words|goodput_ht_cg|goodput_fp|goodput_ll|goodput_ll_cg|admit|admit_ht_on|admit_ht_off|admit_sat_on|admit_sat_off|admit_guard}..." >&2
  exit 2
fi
for stage in "$@"; do
  case $stage in
    tests|step|tapes|serving|serving_ll|serving_ht|serving_fp|codec_eager|scaleout_mps|longform|codec_snr|plots|lm_formats_ht|lm_formats_best|lm_frontend|lm_watermark|lm_timestamps|goodput_sat|goodput_ht|goodput_profiles|goodput_sat_on|goodput_sat_nodl|goodput_sat_off|goodput_ht_on|goodput_ht_nodl|goodput_ht_words|goodput_ht_cg|goodput_fp|goodput_ll|goodput_ll_cg|admit|admit_ht_on|admit_ht_off|admit_sat_on|admit_sat_off|admit_guard) ;;
    *) echo "unknown stage: $stage (tests, step, tapes, serving, serving_ll, serving_ht, serving_fp, codec_eager, scaleout_mps, longform, codec_snr, plots, lm_formats_ht, lm_formats_best, lm_frontend, lm_watermark, lm_timestamps, goodput_sat, goodput_ht, goodput_profiles, goodput_sat_on, goodput_sat_nodl, goodput_sat_off, goodput_ht_on, goodput_ht_nodl, goodput_ht_words, goodput_ht_cg, goodput_fp, goodput_ll, goodput_ll_cg, admit, admit_ht_on, admit_ht_off, admit_sat_on, admit_sat_off, admit_guard)" >&2
       exit 2 ;;
  esac
done

log "gpu suite: stages $*; commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
setup
status=0
for stage in "$@"; do
  "stage_$stage" || status=1
done
log "gpu suite done: status $status"
# the tail of the log doubles as the device call's output
tail -n 120 "$LOG"
exit $status
