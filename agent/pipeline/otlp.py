"""The ``otlp`` exporter: the stock OpenTelemetry OTLP metric exporters (optional extra).

``protocol = "http/protobuf"`` uses ``opentelemetry-exporter-otlp-proto-http`` (extra ``otlp``,
no grpcio), ``"grpc"`` the gRPC one (extra ``otlp-grpc``); both receive the same metric data
as the line-protocol exporter, with their own retry. Not spooled: a site that runs an
OpenTelemetry Collector relies on the collector's queue.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gpufleet.agent.model import Exporter, register_exporter

from gpufleet.errors import ConfigError
from gpufleet.options import Option


@register_exporter("otlp")
class OtlpExporter(Exporter):
    """The ``[otlp]`` section; the part is the stock OTLP exporter (:func:`make_exporter`)."""

    identity = True
    options = (
        Option("endpoint", "str", "http://127.0.0.1:4318/v1/metrics"),
        Option("protocol", "choice", "http/protobuf", choices=("http/protobuf", "grpc")),
        Option("timeout", "duration", 10.0, "", 0.1, 300.0),
        Option("insecure", "bool", True, "gRPC without TLS"),
    )

    @classmethod
    def check_active(cls, table: dict) -> None:
        try:
            parts = urlsplit(table["endpoint"])
        except ValueError as exc:
            raise ConfigError(f"config key 'otlp.endpoint': not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("config key 'otlp.endpoint': expected http(s)://HOST:PORT[/path]")

    @classmethod
    def describe(cls, table: dict) -> str:
        return f"{table['endpoint']} ({table['protocol']})"

    @classmethod
    def build(cls, table: dict, agent):
        return make_exporter(table)


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
