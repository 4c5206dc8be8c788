"""Prometheus metrics of the broker, read from the core's counters at scrape time (no double bookkeeping).

Exported on the server's ``--metrics-port`` (the foundation starts the HTTP endpoint on the default
registry). Names: ``marti_broker_<counter>_total`` for counters, ``marti_broker_<gauge>`` for gauges, and
``marti_broker_compression_ratio``; every series is labelled by ``broker`` (an id, one per core in the process).
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily

from .core import Broker

_COUNTERS = (
    ("sent", "Envelopes accepted by Send and Broadcast"),
    ("enqueued", "Mailbox entries created (fan-out)"),
    ("delivered", "Deliveries, redeliveries included"),
    ("redelivered", "Deliveries after an ack timeout"),
    ("acked", "Deliveries acked"),
    ("expired", "Messages dropped by TTL"),
    ("dead_lettered", "Messages moved to the dead-letter queue"),
    ("duplicates", "Envelopes dropped by dedup"),
    ("rejected", "Send calls refused"),
    ("bytes_in_raw", "Uncompressed bytes of received frames"),
    ("bytes_in_wire", "Compressed bytes of received frames"),
    ("bytes_out_raw", "Uncompressed bytes of delivered frames"),
    ("bytes_out_wire", "Compressed bytes of delivered frames"),
)
_GAUGES = ("sessions", "agents", "pending", "in_flight", "mailbox_bytes", "dead_letters")

_lock = threading.Lock()
_brokers: weakref.WeakValueDictionary[int, Broker] = weakref.WeakValueDictionary()
_registered = False


def _snapshot(broker: Broker):
    # The scrape runs on the HTTP thread while the event loop mutates the core; retry a torn read.
    for _ in range(5):
        try:
            return broker.stats()
        except RuntimeError:
            continue
    return None


class _Collector:
    """Yields one sample per live broker core for every counter and gauge."""

    def collect(self):
        """Builds the metric families (called by prometheus_client on each scrape)."""
        counters = {
            n: CounterMetricFamily(f"marti_broker_{n}", doc, labels=["broker"]) for n, doc in _COUNTERS
        }
        gauges = {
            n: GaugeMetricFamily(f"marti_broker_{n}", n.replace("_", " "), labels=["broker"]) for n in _GAUGES
        }
        ratio = GaugeMetricFamily(
            "marti_broker_compression_ratio", "Raw / wire bytes of all frames", labels=["broker"]
        )
        send_lat = GaugeMetricFamily(
            "marti_broker_avg_send_latency_seconds", "Mean Send handling time", labels=["broker"]
        )
        for key, broker in list(_brokers.items()):
            snap = _snapshot(broker)
            if snap is None:
                continue
            label = [str(key)]
            for name, fam in counters.items():
                fam.add_metric(label, getattr(snap.counters, name))
            for name, fam in gauges.items():
                fam.add_metric(label, getattr(snap, name))
            ratio.add_metric(label, snap.counters.compression_ratio)
            c = snap.counters
            send_lat.add_metric(label, c.send_latency_s_sum / c.send_count if c.send_count else 0.0)
        yield from counters.values()
        yield from gauges.values()
        yield ratio
        yield send_lat


def register_metrics(broker: Broker) -> None:
    """Adds ``broker`` to the scraped cores (registers the collector once per process)."""
    global _registered
    with _lock:
        _brokers[id(broker)] = broker
        if not _registered:
            REGISTRY.register(_Collector())
            _registered = True


def unregister_metrics(broker: Broker) -> None:
    """Stops exporting ``broker``."""
    with _lock:
        _brokers.pop(id(broker), None)
