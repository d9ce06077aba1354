"""Export the dashboards and Grafana provisioning files with the operator's names filled in.

Layout written under the output directory::

    dashboards/<name>.json                      the four dashboards
    provisioning/datasources/gpufleet.yaml      InfluxDB 1.x (user/password) or 2.x/3.x (token)
    provisioning/dashboards/gpufleet.yaml       the file provider that loads dashboards/

Secrets never land in these files: the data source reads ``$GPUFLEET_INFLUX_PASSWORD`` or
``$GPUFLEET_INFLUX_TOKEN`` from Grafana's environment when it provisions.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from gpufleet.dashboards import generate

from gpufleet.errors import ConfigError, GpufleetError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")
_DB = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}")
_USER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d+)?(/[A-Za-z0-9._~/-]*)?")
_INTERVAL = re.compile(r"[1-9][0-9]*(ms|s|m|h)")
_PATH = re.compile(r"/[A-Za-z0-9._/ -]*")


@dataclass
class Settings:
    datasource: str = "gpufleet-influxdb"
    uid: str = "gpufleet-influxdb"
    influx: str = "1"  # 1 | 2 | 3
    url: str = "http://localhost:8086"
    db: str = "gpufleet"
    user: str = "grafana"
    org_id: int = 1
    folder: str = "gpufleet"
    dashboards_path: str = "/var/lib/grafana/dashboards/gpufleet"
    min_interval: str = "10s"

    def validate(self) -> None:
        checks = [
            ("datasource name", self.datasource, _NAME),
            ("datasource uid", self.uid, _UID),
            ("database", self.db, _DB),
            ("user", self.user, _USER),
            ("url", self.url, _URL),
            ("folder", self.folder, _NAME),
            ("min interval", self.min_interval, _INTERVAL),
            ("dashboards path", self.dashboards_path, _PATH),
        ]
        for what, value, pattern in checks:
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise ConfigError(f"invalid {what} {value!r} (expected {pattern.pattern})")
        if self.influx not in ("1", "2", "3"):
            raise ConfigError(f"invalid InfluxDB version {self.influx!r} (expected 1, 2 or 3)")
        if not isinstance(self.org_id, int) or self.org_id < 1:
            raise ConfigError(f"invalid Grafana organisation id {self.org_id!r} (expected an integer >= 1)")


def _q(value: str | int) -> str:
    """A YAML scalar: integers as they are, strings double-quoted (JSON strings are valid YAML)."""
    return str(value) if isinstance(value, int) else json.dumps(value)


def template(name: str) -> str:
    return resources.files("gpufleet.dashboards.provisioning").joinpath(name).read_text()


def datasource_yaml(s: Settings) -> str:
    name = "datasource-influxdb1.yaml" if s.influx == "1" else "datasource-influxdb2.yaml"
    return Template(template(name)).substitute(
        name=_q(s.datasource),
        uid=_q(s.uid),
        org_id=_q(s.org_id),
        url=_q(s.url),
        user=_q(s.user),
        db=_q(s.db),
        min_interval=_q(s.min_interval),
    )


def provider_yaml(s: Settings) -> str:
    return Template(template("dashboard-provider.yaml")).substitute(
        org_id=_q(s.org_id), folder=_q(s.folder), dashboards_path=_q(s.dashboards_path)
    )


def dashboards_for(s: Settings) -> dict[str, dict]:
    """The dashboards with the data source variable defaulting to the provisioned data source."""
    out = {}
    for key, dash in generate.build_all().items():
        dash = copy.deepcopy(dash)
        for v in dash["templating"]["list"]:
            if v["type"] == "datasource":
                v["current"] = {"selected": True, "text": s.datasource, "value": s.uid}
        out[key] = dash
    return out


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def export(out: str | Path, s: Settings) -> list[Path]:
    """Write dashboards and provisioning under ``out``; bad settings or an unwritable ``out`` raise."""
    s.validate()
    out = Path(out)
    files = {
        out / "provisioning" / "datasources" / "gpufleet.yaml": datasource_yaml(s),
        out / "provisioning" / "dashboards" / "gpufleet.yaml": provider_yaml(s),
    }
    for key, dash in dashboards_for(s).items():
        files[out / "dashboards" / f"{key}.json"] = generate.dumps(dash)
    try:
        for path, text in files.items():
            _write(path, text)
    except OSError as exc:
        raise GpufleetError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return list(files)
