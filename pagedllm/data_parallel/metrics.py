"""/metrics series of the data-parallel router: requests routed to, and in flight on, each
replica, and whether it is alive."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedllm.data_parallel.router import PrefixAffinityRouter


class DPCollector(Collector):
    def __init__(self, model_name: str, router: PrefixAffinityRouter) -> None:
        self.model_name, self.router = model_name, router

    def collect(self) -> Iterator[Metric]:
        r = self.router
        labels = ["model_name", "replica"]
        routed = CounterMetricFamily("pagedllm:dp_requests_routed",
                                     "Requests the router sent to each replica.", labels=labels)
        load = GaugeMetricFamily("pagedllm:dp_requests_in_flight",
                                 "Requests in flight on each replica.", labels=labels)
        alive = GaugeMetricFamily("pagedllm:dp_replica_alive",
                                  "1 while the replica is in rotation.", labels=labels)
        for i in range(r.num_replicas):
            key = [self.model_name, str(i)]
            routed.add_metric(key, r.routed[i])
            load.add_metric(key, r.load[i])
            alive.add_metric(key, 1.0 if r.alive[i] else 0.0)
        yield from (routed, load, alive)
