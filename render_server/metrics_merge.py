"""Several processes' Prometheus texts as one: a worker pool's /metrics (`--processes`).

Each metric family is written once, with the samples of every process; a child's samples carry
its labels (which child, its pid), so that sums over them are the worker's figures and each
child's own stay apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Labels = tuple[tuple[str, str], ...]


class _Families:
    """A collector that yields fixed families (prometheus-client renders them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_expositions(own: bytes, others: Mapping[Labels, bytes]) -> bytes:
    """`own` (unlabelled) and each of `others` with its labels added, as one exposition."""
    families: dict[str, Metric] = {}
    sources: list[tuple[Labels, bytes]] = [((), own), *others.items()]
    for labels, text in sources:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for s in family.samples:
                extra = dict(labels)
                merged.samples.append(
                    Sample(s.name, {**s.labels, **extra}, s.value, s.timestamp, s.exemplar)
                )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
