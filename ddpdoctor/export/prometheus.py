"""A Prometheus endpoint per rank for the always-on step series (``ddpdoctor trace --metrics-port [HOST:]PORT``).

Each rank serves ``http://HOST:PORT+local_rank/metrics`` (HOST 127.0.0.1 unless given) from its first step to the
end of the run, with the numbers of its latest step (``capture/series.py``); ``prometheus_client`` is imported only
here, only when asked (``pip install ddpdoctor[prometheus]``). Every sample has the labels ``rank``, ``node`` (the
host name) and ``job`` (the run directory's name; Prometheus renames it ``exported_job`` unless the scrape config
sets ``honor_labels``):

==========================================  =======  ==================================================================
``ddpdoctor_step``                          gauge    index of the last completed step (``ProfilerStep#N``'s N)
``ddpdoctor_steps_total``                   counter  steps completed
``ddpdoctor_step_seconds``                  gauge    wall time of the last step
``ddpdoctor_step_time_seconds_total``       counter  wall time of all steps so far (``rate()`` of it over
                                                     ``rate(ddpdoctor_steps_total)``: the mean step time)
``ddpdoctor_phase_seconds{phase}``          gauge    the last step's time in ``data`` (waiting for the batch),
                                                     ``forward``, ``backward``, ``optimizer``
``ddpdoctor_ddp_comm_seconds``              gauge    DDP's backward communication time, a recent step's
``ddpdoctor_memory_bytes{device}``          gauge    CUDA allocated bytes of the device (``cpu``: process RSS),
                                                     as last measured (the RSS at most every 50 ms)
``ddpdoctor_memory_reserved_bytes{device}``  gauge   CUDA reserved bytes
``ddpdoctor_memory_capacity_bytes{device}``  gauge   the device's memory (the host's on CPU)
``ddpdoctor_last_step_timestamp_seconds``   gauge    unix time the last step ended (a hang: ``time() - this`` grows)
==========================================  =======  ==================================================================

A metric not measured (no DDP module, phase tracking unavailable) has no sample. ``write_textfile`` writes the same
text for node_exporter's textfile collector (``trace --metrics-textfile DIR``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from ddpdoctor.errors import UsageError

DEFAULT_HOST = "127.0.0.1"
PHASES = ("data", "forward", "backward", "optimizer")


def parse_address(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` -> (host, port); UsageError with one line otherwise."""
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--metrics-port {text}: give PORT or HOST:PORT (e.g. 9400 or 0.0.0.0:9400)") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"--metrics-port {text}: a port is 1-65535, not {port}")
    return host, port


def require_client() -> None:
    """UsageError (one line) when prometheus_client is not installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "--metrics-port needs prometheus_client: pip install 'ddpdoctor[prometheus]' (or prometheus_client)"
        ) from None


class SeriesCollector:
    """A prometheus_client collector reading one rank's ``SeriesRecorder`` at each scrape."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def labels(self) -> dict[str, str]:
        s = self._session
        return {"rank": str(s.rank), "node": socket.gethostname(), "job": Path(s.root).name}

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rec = self._session.series
        row = rec.latest
        if row is None:
            return
        base = self.labels()
        names = list(base)

        def gauge(name: str, doc: str, value: Any, **extra: str) -> GaugeMetricFamily | None:
            if value is None:
                return None
            g = GaugeMetricFamily(name, doc, labels=[*names, *extra])
            g.add_metric([*base.values(), *extra.values()], float(value))
            return g

        out = [
            gauge("ddpdoctor_step", "Index of the last completed step.", row["step"]),
            gauge("ddpdoctor_step_seconds", "Wall time of the last step.", row.get("wall_s")),
            gauge("ddpdoctor_last_step_timestamp_seconds", "Unix time the last step ended.", row.get("t")),
        ]
        steps = CounterMetricFamily("ddpdoctor_steps", "Steps completed.", labels=names)
        steps.add_metric(list(base.values()), float(rec.steps))
        total = CounterMetricFamily("ddpdoctor_step_time_seconds", "Wall time of all steps so far.", labels=names)
        total.add_metric(list(base.values()), float(rec.wall_total_s))
        out += [steps, total]
        phases = GaugeMetricFamily(
            "ddpdoctor_phase_seconds", "The last step's time in each phase.", labels=[*names, "phase"]
        )
        seen = False
        for phase in PHASES:
            value = row.get(f"{phase}_s")
            if value is not None:
                phases.add_metric([*base.values(), phase], float(value))
                seen = True
        if seen:
            out.append(phases)
        ddp = rec.last_ddp
        out.append(
            gauge(
                "ddpdoctor_ddp_comm_seconds",
                "DDP's backward communication time (a recent step's).",
                ddp[3] if ddp else None,
            )
        )
        device = rec.device
        mem, reserved = rec.last_memory or (None, None)  # the last measured
        out.append(gauge("ddpdoctor_memory_bytes", "Memory in use.", mem, device=device))
        out.append(gauge("ddpdoctor_memory_reserved_bytes", "CUDA reserved bytes.", reserved, device=device))
        out.append(gauge("ddpdoctor_memory_capacity_bytes", "Device memory.", rec.capacity, device=device))
        yield from (m for m in out if m is not None)


class Exporter:
    """The running endpoint (and/or textfile) of one rank."""

    def __init__(self, session: Any) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SeriesCollector(session)
        self.registry.register(self.collector)
        self.server: Any = None
        self.address: tuple[str, int] | None = None

    def serve(self, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        started = start_http_server(port, addr=host, registry=self.registry)
        self.server = started[0] if isinstance(started, tuple) else None
        self.address = (host, port)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def write_textfile(self, folder: Path, rank: int) -> None:
        """``folder/ddpdoctor_rank<R>.prom``, replaced atomically (node_exporter never reads half a file)."""
        path = Path(folder) / f"ddpdoctor_rank{rank}.prom"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(self.text())
        os.replace(tmp, path)

    def close(self) -> None:
        if self.server is not None:
            try:
                self.server.shutdown()
                self.server.server_close()
            except Exception:
                pass
            self.server = None


def start(session: Any, host: str, port: int) -> Exporter:
    """Serve ``session``'s series on ``host:port`` (the caller adds the local rank to the port)."""
    exporter = Exporter(session)
    exporter.serve(host, port)
    return exporter
