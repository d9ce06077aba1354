"""The ``otlp`` exporter: the stock OpenTelemetry OTLP metric exporters (optional extra).

``protocol = "http/protobuf"`` uses ``opentelemetry-exporter-otlp-proto-http`` (extra ``otlp``,
no grpcio), ``"grpc"`` the gRPC one (extra ``otlp-grpc``); both receive the same metric data
as the line-protocol exporter, with their own retry. Not spooled: a site that runs an
OpenTelemetry Collector relies on the collector's queue.
"""

from __future__ import annotations

from gpufleet.errors import ConfigError


def make_exporter(cfg: dict):
    try:
        if cfg["protocol"] == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            endpoint = cfg["endpoint"]
            return OTLPMetricExporter(endpoint=endpoint, insecure=cfg["insecure"], timeout=cfg["timeout"])
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=cfg["endpoint"], timeout=cfg["timeout"])
    except ImportError as exc:
        extra = "otlp-grpc" if cfg["protocol"] == "grpc" else "otlp"
        raise ConfigError(f"exporter 'otlp' ({cfg['protocol']}) needs the {extra} extra "
                          f"(pip install 'gpufleet[{extra}]'): {exc}") from None
