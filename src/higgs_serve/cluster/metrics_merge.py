"""/metrics of the front end: each replica's metrics with a `replica` label, plus the router's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from higgs_serve.metrics import PREFIX


class _Replicas(Collector):
    """Re-exports the scraped families, every sample labelled with its replica."""

    def __init__(self, scraped: Mapping[str, str]):
        self._scraped = scraped

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica_id, text in self._scraped.items():
            for family in text_string_to_metric_families(text):
                target = merged.get(family.name)
                if target is None:
                    target = merged[family.name] = Metric(family.name, family.documentation,
                                                          family.type, family.unit)
                for sample in family.samples:
                    target.add_sample(sample.name, {**sample.labels, "replica": replica_id},
                                      sample.value)
        yield from merged.values()


class _RouterMetrics(Collector):
    def __init__(self, frontend):
        self._frontend = frontend

    def collect(self) -> Iterator[Metric]:
        router = self._frontend.router
        in_flight = GaugeMetricFamily(f"{PREFIX}_router_in_flight_requests",
                                      "Requests the front end has in flight on each replica.",
                                      labels=["replica"])
        ready = GaugeMetricFamily(f"{PREFIX}_router_replica_ready",
                                  "1 if the replica takes traffic, else 0.", labels=["replica"])
        restarts = CounterMetricFamily(f"{PREFIX}_router_replica_restarts",
                                       "Times the replica's process was restarted.",
                                       labels=["replica"])
        for replica_id, replica in self._frontend.replicas.items():
            in_flight.add_metric([replica_id], router.replicas[replica_id].in_flight)
            ready.add_metric([replica_id], float(replica.ready))
            restarts.add_metric([replica_id], replica.restarts)
        routed = CounterMetricFamily(f"{PREFIX}_router_routed",
                                     "Requests routed, by reason: affinity (a home of the voice "
                                     "key), spill (its homes were too busy), balance (no key).",
                                     labels=["reason"])
        for reason, count in router.stats.routed.items():
            routed.add_metric([reason], count)
        yield from (in_flight, ready, restarts, routed)
        yield GaugeMetricFamily(f"{PREFIX}_router_affinity_ratio",
                                "Keyed requests that went to a home of their key / all keyed.",
                                value=router.stats.affinity_ratio)
        yield CounterMetricFamily(f"{PREFIX}_router_retries",
                                  "Requests tried again on another replica before their first byte.",
                                  value=router.stats.retries)
        yield CounterMetricFamily(f"{PREFIX}_router_rejected",
                                  "Requests refused with 429 because every replica was full.",
                                  value=router.stats.rejected)


def render(scraped: Mapping[str, str], frontend) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Replicas(scraped))
    registry.register(_RouterMetrics(frontend))
    return generate_latest(registry)
