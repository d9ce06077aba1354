"""Run a dashboard's queries against InfluxDB's ``/query`` the way Grafana would.

``Runner`` resolves the template variables in dashboard order (each variable's
``SHOW TAG VALUES`` query expanded with the ones before it), then expands and runs every
panel target and annotation query. The tests use it to prove the dashboards against a real
InfluxDB; the preview renderer uses it to draw them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import requests
from gpufleet.dashboards.expand import ALL, Context, Var, expand, expand_variable_query

from gpufleet.errors import GpufleetError

QueryFn = Callable[[str], dict]


def influx_query_fn(url: str, db: str, token: str | None = None, timeout: float = 30.0) -> QueryFn:
    """``/query`` over HTTP (epoch=ms, as Grafana asks); a token goes in ``Authorization: Token``."""
    headers = {"Authorization": f"Token {token}"} if token else {}

    def run(q: str) -> dict:
        try:
            r = requests.post(
                url.rstrip("/") + "/query",
                data={"q": q, "db": db, "epoch": "ms"},
                headers=headers,
                timeout=timeout,
            )
        except requests.RequestException as exc:
            raise GpufleetError(f"InfluxDB at {url} did not answer: {exc.__class__.__name__}") from None
        try:
            return r.json()
        except ValueError:
            raise GpufleetError(f"InfluxDB at {url} answered HTTP {r.status_code} without JSON") from None

    return run


@dataclass
class Series:
    name: str
    tags: dict[str, str]
    columns: list[str]
    values: list[list]


@dataclass
class Result:
    query: str  # as sent
    error: str | None
    series: list[Series] = field(default_factory=list)


def parse(resp: dict) -> tuple[str | None, list[Series]]:
    if "error" in resp:
        return resp["error"], []
    results = resp.get("results") or [{}]
    res = results[0]
    if "error" in res:
        return res["error"], []
    return None, [
        Series(s.get("name", ""), s.get("tags") or {}, s["columns"], s.get("values") or [])
        for s in res.get("series", [])
    ]


def targets(dash: dict) -> Iterator[tuple[dict, dict]]:
    """(panel, target) for every query of every panel (rows included)."""
    for p in dash["panels"]:
        for sub in [p, *p.get("panels", [])]:
            for t in sub.get("targets", []):
                yield sub, t


class Runner:
    def __init__(
        self,
        dash: dict,
        query: QueryFn,
        from_ms: int,
        to_ms: int,
        selections: dict[str, str | list[str]] | None = None,
        min_interval: str = "10s",
    ):
        self.dash = dash
        self.query = query
        self.ctx = Context(from_ms, to_ms, min_interval=min_interval)
        self.variable_results: dict[str, Result] = {}
        self._resolve(selections or {})

    def _resolve(self, selections: dict) -> None:
        for v in self.dash["templating"]["list"]:
            if v["type"] != "query":
                continue
            q = expand_variable_query(v["query"], self.ctx)
            err, series = parse(self.query(q))
            self.variable_results[v["name"]] = Result(q, err, series)
            options = sorted({row[1] for s in series for row in s.values})
            chosen = selections.get(v["name"])
            if chosen is None:
                chosen = ALL if v.get("includeAll") else (options[0] if options else "")
            self.ctx.variables[v["name"]] = Var(
                v["name"],
                chosen,
                multi=v.get("multi", False),
                include_all=v.get("includeAll", False),
                all_value=v.get("allValue"),
                options=options,
            )

    def options(self, name: str) -> list[str]:
        return self.ctx.variables[name].options

    def expand(self, panel: dict, t: dict) -> str:
        self.ctx.max_data_points = panel.get("maxDataPoints", 1000)
        return expand(t["query"], self.ctx, panel.get("interval"))

    def run(self, panel: dict, t: dict) -> Result:
        q = self.expand(panel, t)
        err, series = parse(self.query(q))
        return Result(q, err, series)

    def run_all(self) -> Iterator[tuple[dict, dict, Result]]:
        for p, t in targets(self.dash):
            yield p, t, self.run(p, t)

    def annotations(self) -> Iterator[tuple[dict, Result]]:
        for a in self.dash["annotations"]["list"]:
            if a.get("builtIn"):
                continue
            q = expand((a.get("target") or a)["query"], self.ctx)
            err, series = parse(self.query(q))
            yield a, Result(q, err, series)
