"""Every Prometheus metric higgs-serve exports, defined once.

Each server app owns a `ServerMetrics` with its own `CollectorRegistry` (tests build several apps
in one process). Definitions follow docs/model.md#metrics: TTFA is measured from the request's arrival to
the first non-empty audio chunk; RTF is end-to-end latency / seconds of audio returned. Engine
gauges (queue depth, running requests, KV blocks) are read from the engine when scraped, so they
are never stale, and so are the voice-cloning reference encoder's counters (encodes, cache hits,
encoder time). The Stage 0 step histogram is fed from the engine thread (prometheus_client
metrics are thread-safe).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# `*_created` timestamp series double the output and no dashboard here reads them.
disable_created_metrics()
PREFIX = "higgs_serve"

_ALIGNMENT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_WORDS_LAG_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TTFA_BUCKETS_S = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
_RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
_STEP_BUCKETS_S = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.5)
_QUEUE_WAIT_BUCKETS_S = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# a chunk's lead: below 0 its listener waited; below -0.1 the stream counts as stalled
_SLACK_BUCKETS_S = (-1.0, -0.5, -0.1, -0.05, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

# Outcomes of a speech request (label values of requests_total).
# "over_capacity": a stream refused with 503 because its first audio would be past --ttfa-budget-s
OUTCOMES = ("stop", "length", "abort", "invalid", "rejected", "over_capacity", "error")

# Engine statistics exported as gauges: stats key -> (metric name, help).
ENGINE_GAUGES: dict[str, tuple[str, str]] = {
    "num_waiting": ("queue_depth", "Requests waiting in the engine's queue."),
    "num_running": ("running_requests", "Requests holding a decode slot."),
    "free_kv_blocks": ("kv_blocks_free", "Free KV-cache blocks."),
    "total_kv_blocks": ("kv_blocks_total", "KV-cache blocks in the pool."),
    "stream_capacity": ("stream_capacity", "Streams the engine lets run at once now: the stream limit, "
                        "started from the capacity timed at start-up and steered by the listeners' leads."),
    "stream_capacity_predicted": ("stream_capacity_predicted", "Streams the step times and Stage 1 costs "
                                  "(timed at start-up, scaled by the live steps) say keep real time at once."),
    "stream_lead_tail_seconds": ("stream_lead_tail_seconds", "The low tail (1st percentile) of the leads "
                                 "streamed chunks left with over the last second (0 when none left)."),
}


# Stage 1's running totals in the engine's stats, exported as counters. Windows per call
# (windows / calls) is the codec's batching: small batches cost Stage 0 the SMs they hold.
CODEC_COUNTERS: dict[str, tuple[str, str]] = {
    "codec_calls": ("codec_calls", "Batched codec decodes (Stage 1)."),
    "codec_windows": ("codec_windows", "Streaming windows the codec decoded."),
    "codec_graph_calls": ("codec_graph_calls", "Codec decodes that replayed a CUDA graph."),
    "codec_busy_seconds": ("codec_busy_seconds", "Wall seconds the codec thread spent decoding."),
    # the prefix cache's hit rate (hits / queries, in prompt tokens): what voice-affinity routing
    # across replicas is meant to raise
    "prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens served from the prefix cache."),
}

# The watermark stage's running totals (engine/mark_stage.py), present when the mark is on:
# busy seconds per audio second is the mark's cost where it runs (the codec's device).
WATERMARK_COUNTERS: dict[str, tuple[str, str]] = {
    "watermark_calls": ("watermark_calls", "Batched watermark calls (the engine's mark stage)."),
    "watermark_chunks": ("watermark_chunks", "Audio chunks the watermark marked."),
    "watermark_audio_seconds": ("watermark_audio_seconds", "Seconds of audio the watermark marked."),
    "watermark_busy_seconds": ("watermark_busy_seconds", "Wall seconds the mark stage spent marking."),
}

# Engine counters with one label, exported from the stats keys "<family>:<label value>": family ->
# (metric name, label, help). How Stage 0's steps ran: a serving run that is slower than the step
# benchmarks says whether its steps took the graphs and the launch tapes they were measured with.
LABELLED_COUNTERS: dict[str, tuple[str, str, str]] = {
    "stage0_steps": ("stage0_steps", "mode",
                     "Stage 0 steps by step mode: full (the whole decode step's CUDA graph), piecewise, "
                     "local_mlp (eager attention, the layers' MLP graphs), none (eager)."),
    "stream_limit_changes": ("stream_limit_changes", "direction",
                             "Moves of the stream limit (engine/deadlines/stream_limit.py): fall (a listener lost "
                             "ground), probe (one step up while streams waited), jump (up to the measured capacity)."),
    "eager_steps": ("eager_steps", "outcome",
                    "Eagerly run Stage 0 steps (modes local_mlp and none) by how their decoder stack ran: "
                    "replay (from a launch tape), recorded (op by op while its tape recorded), void (recorded, "
                    "not kept), op_by_op (no tape: past the taped size, or tapes off)."),
}


def _labelled_counters(stats: Mapping[str, float]) -> Iterator[CounterMetricFamily]:
    for family, (name, label, help_text) in LABELLED_COUNTERS.items():
        samples = [(key.partition(":")[2], value) for key, value in stats.items()
                   if key.partition(":")[0] == family]
        if samples:
            metric = CounterMetricFamily(f"{PREFIX}_{name}", help_text, labels=[label])
            for label_value, value in samples:
                metric.add_metric([label_value], value)
            yield metric


class _EngineStats(Collector):
    """Reads the engine's stats (gauges, and the codec's counters) and the server's in-flight
    count at scrape time."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, float]],
                 in_flight: Callable[[], int]):
        self._engine_stats = engine_stats
        self._in_flight = in_flight

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._engine_stats()
        for key, (name, help_text) in ENGINE_GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", help_text, value=stats[key])
        for key, (name, help_text) in (CODEC_COUNTERS | WATERMARK_COUNTERS).items():
            if key in stats:
                yield CounterMetricFamily(f"{PREFIX}_{name}", help_text, value=stats[key])
        yield from _labelled_counters(stats)
        yield GaugeMetricFamily(f"{PREFIX}_server_in_flight_requests",
                                "Speech requests admitted by the server and not yet finished.",
                                value=self._in_flight())


# Reference-encoder counters, read at scrape time: attribute -> (metric name, help).
REFERENCE_COUNTERS: dict[str, tuple[str, str]] = {
    "encode_calls": ("reference_encodes",
                     "Reference clips run through the codec encoder (cache misses)."),
    "cache_hits": ("reference_cache_hits",
                   "Reference clips answered from the encoded-codes cache."),
    "encode_seconds": ("reference_encode_seconds", "Wall seconds spent in the reference encoder."),
    "encoded_audio_seconds": ("reference_encoded_audio_seconds",
                              "Seconds of reference audio run through the encoder."),
}


class _ReferenceCounters(Collector):
    """Exports the voice-cloning encoder's own counters (voices.reference_encoder) at scrape time.

    The server's hook is any callable audio -> codes (tests pass plain functions), so each
    counter is exported only when the hook object has that attribute: `getattr` on this one
    object, rather than a Protocol the test lambdas would have to fake.
    """

    def __init__(self, encoder: object):
        self._encoder = encoder

    def collect(self) -> Iterator[CounterMetricFamily]:
        for attribute, (name, help_text) in REFERENCE_COUNTERS.items():
            value = getattr(self._encoder, attribute, None)
            if value is not None:
                yield CounterMetricFamily(f"{PREFIX}_{name}", help_text, value=value)


# The encoder processes' state (server/last_mile/encode_pool.py), read at scrape time: stats key ->
# (metric name, help, counter?).
ENCODER_STATS: dict[str, tuple[str, str, bool]] = {
    "encoder_processes": ("encoder_processes", "Encoder processes running (--encode-processes).", False),
    "encoder_streams": ("encoder_streams", "Responses whose encoding is assigned to an encoder process.", False),
    "encoder_restarts": ("encoder_restarts", "Encoder processes replaced after they died or "
                         "stopped answering (their responses ended with an error).", True),
}
# The aligner processes' stats (alignment/pool.py AlignerPool.stats), the same way.
ALIGNER_STATS: dict[str, tuple[str, str, bool]] = {
    "aligner_processes": ("aligner_processes", "Aligner processes running (--alignment-workers; "
                          "each starts at its first sentence).", False),
    "aligner_waiting_audio_seconds": ("aligner_waiting_audio_seconds", "Seconds of audio queued "
                                      "for (or being aligned by) the aligner processes.", False),
    "aligner_restarts": ("aligner_restarts", "Aligner processes replaced after they died or "
                         "stopped answering.", True),
    "aligner_overloads": ("aligner_overloads", "Sentences whose words were skipped because every "
                          "aligner process had --alignment-queue-s of audio waiting.", True),
}


class _PoolStats(Collector):
    """A worker pool's stats() at scrape time: ENCODER_STATS or ALIGNER_STATS."""

    def __init__(self, stats: Callable[[], Mapping[str, float]],
                 table: dict[str, tuple[str, str, bool]]):
        self._stats = stats
        self._table = table

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        for key, (name, help_text, counter) in self._table.items():
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(f"{PREFIX}_{name}", help_text, value=stats[key])


class _CertificateExpiry(Collector):
    """Seconds until the C2PA signing certificate expires (audio/provenance.py), at scrape time."""

    def __init__(self, seconds_to_expiry: Callable[[], float]):
        self._seconds_to_expiry = seconds_to_expiry

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(f"{PREFIX}_c2pa_certificate_expiry_seconds",
                                "Seconds until the C2PA signing certificate expires (negative: "
                                "expired; files are then sent unsigned).", value=self._seconds_to_expiry())


class ServerMetrics:
    def __init__(self, engine_stats: Callable[[], Mapping[str, float]],
                 in_flight: Callable[[], int], reference_encoder: object | None = None):
        """reference_encoder: the server's cloning hook (None = cloning off: no such metrics)."""
        self.registry = CollectorRegistry()
        self.ttfa_seconds = Histogram(
            f"{PREFIX}_ttfa_seconds", "Time from request arrival to the first audio chunk.",
            buckets=_TTFA_BUCKETS_S, registry=self.registry)
        self.rtf = Histogram(
            f"{PREFIX}_rtf", "Real-time factor: request latency / seconds of audio returned.",
            buckets=_RTF_BUCKETS, registry=self.registry)
        self.requests = Counter(
            f"{PREFIX}_requests", "Speech requests by outcome.", ["outcome"],
            registry=self.registry)
        for outcome in OUTCOMES:  # export zeros so dashboards see every series from the start
            self.requests.labels(outcome)
        self.generated_frames = Counter(
            f"{PREFIX}_generated_frames", "Audio frames (40 ms) returned to clients.",
            registry=self.registry)
        self.audio_seconds = Counter(
            f"{PREFIX}_audio_seconds", "Seconds of audio returned to clients.",
            registry=self.registry)
        self.step_seconds = Histogram(
            f"{PREFIX}_stage0_step_seconds", "Wall time of one Stage 0 engine step.",
            buckets=_STEP_BUCKETS_S, registry=self.registry)
        self.stage0_rows = Counter(
            f"{PREFIX}_stage0_rows", "Delayed code rows (one per running request per step) Stage 0 sampled.",
            registry=self.registry)
        # issue 53: stalls as the server sees them (server/last_mile/playback_meter.py), the lead
        # each streamed chunk leaves with, and the wait for a place in the engine
        self.queue_wait_seconds = Histogram(
            f"{PREFIX}_queue_wait_seconds", "Time a streamed request waited for its place in the engine "
            "(the engine speaking all the streams it can in real time).", buckets=_QUEUE_WAIT_BUCKETS_S,
            registry=self.registry)
        self.stream_slack_seconds = Histogram(
            f"{PREFIX}_stream_slack_seconds", "Lead of each streamed chunk after the first as it left: the "
            "audio sent before it (at the response's speed) less the time since the stream's first audio; "
            "below 0 a listener's player waited.", buckets=_SLACK_BUCKETS_S, registry=self.registry)
        self.streams = Counter(
            f"{PREFIX}_streams", "Streamed responses that sent audio.", registry=self.registry)
        self.streams_stalled = Counter(
            f"{PREFIX}_streams_stalled", "Streamed responses whose listener fell more than 100 ms behind "
            "(a player started at the first audio, at 1x).", registry=self.registry)
        self.ws_sessions = Gauge(
            f"{PREFIX}_ws_sessions", "Open WebSocket speech sessions (/v1/audio/speech/stream); "
            "each of their sentences also counts as a request.", registry=self.registry)
        # word timestamps (server/last_mile/word_timestamps.py): how long a finished sentence waits for
        # its words (queue + the aligner process), and the sentences whose words are missing
        self.alignment_seconds = Histogram(
            f"{PREFIX}_alignment_seconds", "Time from a sentence's last audio to its word "
            "timestamps (aligner queue and work).", buckets=_ALIGNMENT_BUCKETS_S,
            registry=self.registry)
        self.alignment_failures = Counter(
            f"{PREFIX}_alignment_failures", "Sentences whose word timestamps could not be "
            "computed (sent as missing; their audio is unaffected).", registry=self.registry)
        self.words_lag_seconds = Histogram(
            f"{PREFIX}_words_lag_seconds", "Time from a sentence's last audio to its word "
            "timestamps handed to its response (the aligners run below the engine's priority, "
            "so under load the words come later, never the audio).",
            buckets=_WORDS_LAG_BUCKETS_S, registry=self.registry)
        self.registry.register(_EngineStats(engine_stats, in_flight))
        if reference_encoder is not None:
            self.registry.register(_ReferenceCounters(reference_encoder))

    def watch_encoders(self, stats: Callable[[], Mapping[str, float]]) -> None:
        """Export the encoder processes' stats (ENCODER_STATS) at scrape time."""
        self.registry.register(_PoolStats(stats, ENCODER_STATS))

    def watch_aligners(self, stats: Callable[[], Mapping[str, float]]) -> None:
        """Export the aligner processes' stats (ALIGNER_STATS) at scrape time."""
        self.registry.register(_PoolStats(stats, ALIGNER_STATS))

    def watch_certificate(self, seconds_to_expiry: Callable[[], float]) -> None:
        """Export the signing certificate's time to expiry at scrape time (--c2pa-cert)."""
        self.registry.register(_CertificateExpiry(seconds_to_expiry))

    def observe_step(self, step_seconds: float, num_seqs: int, num_rows: int) -> None:
        """Engine step hook: (seconds, num_seqs, num_rows); called from the engine thread."""
        self.step_seconds.observe(step_seconds)
        self.stage0_rows.inc(num_rows)

    def observe_alignment(self, seconds: float, failed: bool) -> None:
        self.alignment_seconds.observe(seconds)
        if failed:
            self.alignment_failures.inc()

    def observe_words_lag(self, seconds: float) -> None:
        self.words_lag_seconds.observe(seconds)

    def count(self, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown request outcome {outcome!r}; expected one of {OUTCOMES}")
        self.requests.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
