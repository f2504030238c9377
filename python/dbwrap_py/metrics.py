"""Prometheus metrics of the node agent and the proxy daemon (off by default).

``--metrics-port PORT`` (``[ADDR:]PORT``; ADDR defaults to 127.0.0.1)
serves ``/metrics`` in Prometheus's text format, written by the
``prometheus_client`` library (Debian's python3-prometheus-client), from a
registry of the process's own (never the library's global one). The
library is imported only here, and only when metrics are asked for: without
it the option fails with what to install, and nothing else changes.

The endpoint is read-only: GET and HEAD of ``/metrics`` only. Labels name
operations, never a record's key or value, a path or a secret.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dbwrap_py.errors import ConfigError

DEFAULT_ADDRESS = "127.0.0.1"
#: what the node agent writes in its cache directory while it serves metrics:
#: ``ADDR PORT``, for ``dbwrap-py status``
AGENT_METRICS_FILE = "agent.metrics"
#: the buckets of the lease renewal histogram, in seconds
RENEWAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def prometheus() -> ModuleType:
    """prometheus_client, or a ConfigError saying what to install."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("--metrics-port needs the prometheus_client library: apt-get install "
                          "python3-prometheus-client (or pip install prometheus_client)") from None
    return prometheus_client


def parse_listen(value: str) -> tuple[str, int]:
    """``PORT`` or ``ADDR:PORT`` (``[ADDR]:PORT`` for IPv6) -> (addr, port)."""
    addr, sep, port = value.rpartition(":")
    if not sep:
        addr = DEFAULT_ADDRESS
    addr = addr.strip("[]") or DEFAULT_ADDRESS
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"--metrics-port {value!r}: give PORT or ADDR:PORT") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--metrics-port {value!r}: a port is 0-65535")
    return addr, number


def metrics_url(addr: str, port: int) -> str:
    return f"http://{f'[{addr}]' if ':' in addr else addr}:{port}/metrics"


def agent_metrics_url(cache_dir: str | Path) -> str | None:
    """Where the node agent serving ``cache_dir`` serves its metrics, as its
    AGENT_METRICS_FILE says; None when it serves none."""
    try:
        addr, port = (Path(cache_dir) / AGENT_METRICS_FILE).read_text().split()
    except FileNotFoundError:
        return None
    return metrics_url(addr, int(port))


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """The unlabelled samples at ``url`` (counters, gauges, a histogram's
    count and sum), by name: what ``dbwrap-py status`` and the benchmarks read."""
    import urllib.request

    prometheus()  # the library, or what to install
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


@dataclass
class MetricsServer:
    """The HTTP endpoint's server, on a daemon thread until ``close()``."""

    httpd: Any
    thread: threading.Thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return host, port

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def serve(registry: Any, addr: str, port: int) -> MetricsServer:
    """Serve ``registry`` at http://ADDR:PORT/metrics (port 0: any free one)."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    client = prometheus()
    from prometheus_client.exposition import ThreadingWSGIServer

    app = client.make_wsgi_app(registry)

    def read_only(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"read-only: GET /metrics\n"]
        if environ.get("PATH_INFO") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"GET /metrics\n"]
        return app(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
            pass

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    try:
        httpd = make_server(addr, port, read_only, Server, handler_class=Quiet)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {addr}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


class _Collector:
    """Reads a process's own counters at each scrape (nothing counted twice)."""

    def __init__(self, collect: Callable[[], Iterator[Any]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Any]:
        return self._collect()

    def describe(self) -> list[Any]:
        return []  # no collect at registration


# -- the node agent -------------------------------------------------------------------

def agent_registry(agent: Any) -> Any:
    """The node agent's registry: its own counters read at each scrape, and
    the lease renewal and release request histograms, which
    ``agent.renewal_observer`` and ``agent.release_observer`` feed."""
    client = prometheus()
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    registry = client.CollectorRegistry(auto_describe=False)
    prefix = "dbwrap_py_node_agent_"

    def collect() -> Iterator[Any]:
        counters = (
            ("release_requests_served", "release requests served: records and buckets handed over to "
                                        "another node", agent.served),
            ("records_handed_back", "deleted records handed back to the store by the vacuum",
             agent.vacuumed),
            ("records_written_through", "records written through for traverses on other nodes",
             agent.written_through),
            ("lease_renewals", "keepalives of the node lease the store answered", agent.renewals),
            ("lease_renewal_failures", "keepalives of the node lease that failed (store away or slow)",
             agent.renewal_failures),
            ("lease_regrants", "node leases granted anew because the last one expired", agent.regrants),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(prefix + name, text, value=value)
        gauges = (
            ("pending_release_requests", "release requests waiting: queued, or held by a process",
             agent.pending_requests()),
            ("owned_records", "records the node owned at the agent's last vacuum pass (by record lock "
                              "or through a bucket; chains held by a process then not counted)",
             agent.owned_records),
            ("owned_buckets", "buckets the node claimed at the agent's last vacuum pass",
             agent.owned_buckets),
            ("lease_valid_seconds", "seconds the node lease is surely alive for, as last published",
             agent.lease_valid_seconds()),
        )
        for name, text, value in gauges:
            yield GaugeMetricFamily(prefix + name, text, value=value)

    registry.register(_Collector(collect))
    histogram = client.Histogram(prefix + "lease_renewal_seconds",
                                 "seconds from sending a keepalive of the node lease to its answer",
                                 registry=registry, buckets=RENEWAL_BUCKETS)
    agent.renewal_observer = histogram.observe
    served = client.Histogram(prefix + "release_request_seconds",
                              "seconds from taking in another node's release request to serving it "
                              "(a process of this node may hold the record meanwhile)",
                              registry=registry, buckets=RENEWAL_BUCKETS)
    agent.release_observer = served.observe
    return registry


# -- the proxy daemon -----------------------------------------------------------------

def daemon_registry(daemon: Any) -> Any:
    """The proxy daemon's registry: its request counts (the ones it logs
    as it stops), adapter calls, record-lock waits and connections."""
    client = prometheus()
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from dbwrap_py.proxy.log import op_name

    registry = client.CollectorRegistry(auto_describe=False)
    prefix = "dbwrap_py_proxy_"

    def collect() -> Iterator[Any]:
        stats = daemon.table.stats
        requests = CounterMetricFamily(prefix + "requests", "requests taken in, by operation", labels=["op"])
        for raw, count in sorted(dict(daemon.requests).items()):
            requests.add_metric([op_name(raw)], count)
        yield requests
        calls = CounterMetricFamily(prefix + "adapter_calls",
                                    "calls into the adapter (the store, or the node cache in front of it), "
                                    "by operation", labels=["op"])
        for op, count in sorted(dict(stats.adapter_calls).items()):
            calls.add_metric([op], count)
        yield calls
        yield CounterMetricFamily(prefix + "lock_waits", "record-lock requests that waited for another "
                                  "connection's hold", value=stats.lock_waits)
        yield CounterMetricFamily(prefix + "lock_wait_seconds", "seconds record-lock requests waited, "
                                  "granted or timed out", value=stats.lock_wait_seconds)
        takes = CounterMetricFamily(prefix + "node_cache_takes", "ownership the daemon took from the store "
                                    "for its node's node cache: records taken one by one, "
                                    "buckets claimed", labels=["what"])
        for what, count in sorted(daemon.table.takes().items()):
            takes.add_metric([what], count)
        yield takes
        yield GaugeMetricFamily(prefix + "connected_clients", "connections (smbd processes) now",
                                value=daemon.connected())
        yield GaugeMetricFamily(prefix + "open_databases", "databases open now", value=daemon.table.open_count())

    registry.register(_Collector(collect))
    return registry
