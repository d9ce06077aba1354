"""Static PNG previews of the dashboards, drawn with matplotlib from the queries Grafana would run.

Each panel is drawn where its ``gridPos`` puts it (24 columns), from the results of its own
targets expanded like Grafana expands them (``gpufleet.dashboards.runner``): time series as lines
(stacked where the panel stacks, thresholds dashed), stats as one big number, tables as text
(with the panel's merge / organize / grouping-to-matrix transformations), the heatmap as a
time x value histogram. A preview, not a Grafana: good enough for users to see what they get.
"""

from __future__ import annotations

import re
import warnings
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.dashboards import generate
from gpufleet.dashboards.runner import QueryFn, Result, Runner, Series

BG, PANEL, GRID, TEXT, DIM = "#111217", "#181b1f", "#2c3235", "#d8d9da", "#8e8e8e"
COLORS = [
    "#73bf69",
    "#f2cc0c",
    "#5794f2",
    "#ff9830",
    "#b877d9",
    "#8ab8ff",
    "#f2495c",
    "#96d98d",
    "#ffcb7d",
    "#ca95e5",
    "#6ccf8e",
    "#fade2a",
    "#c0d8ff",
    "#ffb357",
    "#a352cc",
    "#56a64b",
]
ROW_PX = 30  # Grafana's grid row height


def fmt(v, unit: str | None) -> str:
    """A value the way the panel's unit would show it (roughly Grafana's formatters)."""
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if unit is None:  # no unit: the number as it is
        return str(v) if isinstance(v, int) or float(v).is_integer() else f"{v:.3g}"
    if unit == "percentunit":
        return f"{v * 100:.0f}%" if abs(v) >= 0.1 or v == 0 else f"{v * 100:.1f}%"
    if unit == "celsius":
        return f"{v:.0f} °C" if float(v).is_integer() else f"{v:.1f} °C"
    if unit == "watt":
        return f"{v / 1000:.1f} kW" if abs(v) >= 10_000 else f"{v:.0f} W"
    if unit == "joule":
        for div, suf in ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ")):
            if abs(v) >= div:
                return f"{v / div:.1f} {suf}"
        return f"{v:.0f} J"
    if unit == "rotmhz":
        return f"{v / 1000:.2f} GHz" if abs(v) >= 1000 else f"{v:.0f} MHz"
    if unit == "bytes":
        for div, suf in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(v) >= div:
                return f"{v / div:.1f} {suf}" if abs(v) < 10 * div else f"{v / div:.0f} {suf}"
        return f"{v:.0f} B"
    if unit == "ns":
        s = v / 1e9
        return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s" if s >= 1 else f"{v / 1e6:.0f} ms"
    if unit == "s":
        return f"{v / 60:.0f} min" if v >= 120 else f"{v:.0f} s"
    if unit == "cpm":
        return f"{v:.1f} c/m" if v < 10 else f"{v:.0f} c/m"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 1000 else f"{v / 1000:.1f}K"
    return f"{v / 1000:.1f}K" if abs(v) >= 10_000 else f"{v:.0f}"


def label(target: dict, s: Series, col: str) -> str:
    alias = target.get("alias")
    if not alias:
        tags = ",".join(f"{k}={v}" for k, v in s.tags.items())
        return f"{s.name}.{col}" + (f" {{{tags}}}" if tags else "")
    out = re.sub(r"\$tag_(\w+)", lambda m: s.tags.get(m.group(1), ""), alias)
    return out.replace("$col", col).replace("$m", s.name)


def _table_rows(results: list[tuple[dict, Result]], panel: dict) -> tuple[list[str], list[list]]:
    frames = []
    for _t, res in results:
        for s in res.series:
            for v in s.values:
                frames.append({**s.tags, **dict(zip(s.columns, v, strict=True))})
    for tr in panel.get("transformations", []):
        if tr["id"] == "merge":
            merged: dict[tuple, dict] = {}
            for r in frames:
                key = tuple(sorted((k, v) for k, v in r.items() if isinstance(v, str)))
                merged.setdefault(key, {}).update(r)
            frames = list(merged.values())
        elif tr["id"] == "organize":
            drop = {k.lower() for k, on in tr["options"].get("excludeByName", {}).items() if on}
            frames = [{k: v for k, v in r.items() if k.lower() not in drop} for r in frames]
        elif tr["id"] == "groupingToMatrix":
            o = tr["options"]
            rows_, cols = {}, []
            for r in frames:
                c = str(r[o["columnField"]])
                if c not in cols:
                    cols.append(c)
                rows_.setdefault(str(r[o["rowField"]]), {})[c] = r.get(o["valueField"])
            cols.sort(key=lambda x: (len(x), x))
            header = [f"{o['rowField']} \\ {o['columnField']}", *cols]
            body = [[k, *[rows_[k].get(c) for c in cols]] for k in sorted(rows_, key=lambda x: (len(x), x))]
            return header, body
    header: list[str] = []
    for r in frames:
        for k in r:
            if k not in header:
                header.append(k)
    if "time" in header:
        header.remove("time")
        header.insert(0, "time")
    sort = (panel.get("options", {}).get("sortBy") or [{}])[0].get("displayName")
    if sort in header:
        frames.sort(key=lambda r: (r.get(sort) is None, -(r.get(sort) or 0)))
    return header, [[r.get(k) for k in header] for r in frames]


def _unit_for(panel: dict, col: str) -> str | None:
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"]["id"] == "byName" and o["matcher"]["options"] == col:
            for p in o["properties"]:
                if p["id"] == "unit":
                    return p["value"]
    return panel["fieldConfig"]["defaults"].get("unit")


def _cell(v, col: str, panel: dict) -> str:
    if col == "time" and isinstance(v, int):
        return datetime.fromtimestamp(v / 1000, UTC).strftime("%H:%M:%S")
    if isinstance(v, str) and len(v) > 60:
        return v[:57] + "..."
    return fmt(v, _unit_for(panel, col)) if not isinstance(v, str) else v


def draw_table(ax, panel, results, height_px, width_px):
    header, body = _table_rows(results, panel)
    ax.axis("off")
    if not header:
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
        return
    max_rows = max(1, int(height_px / 17) - 2)
    shown = body[:max_rows]
    cells = [[_cell(r[i], h, panel) for i, h in enumerate(header)] for r in shown]
    widths = [max([len(str(h))] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]
    budget = int(width_px / 5.6)  # characters that fit at this font size
    while sum(w + 2 for w in widths) > budget and max(widths) > 4:
        widths[widths.index(max(widths))] -= 1
    total = sum(w + 2 for w in widths)
    x = 0.01
    step = 1.0 / (max_rows + 1.5)
    thresholds = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colored = panel["fieldConfig"]["defaults"].get("custom", {}).get("cellOptions", {}).get("type")

    def clip(text: str, w: int) -> str:
        return text if len(text) <= w else text[: max(1, w - 1)] + "…"

    for i, h in enumerate(header):
        w = (widths[i] + 2) / total * 0.98
        ax.text(
            x,
            1 - step * 0.6,
            clip(str(h), widths[i]),
            color="#6e9fff",
            fontsize=7,
            fontweight="bold",
            va="center",
            transform=ax.transAxes,
            clip_on=True,
        )
        for j, r in enumerate(shown):
            y = 1 - step * (j + 1.6)
            v = r[i]
            if colored and isinstance(v, int | float) and i > 0:
                color = next(
                    (st["color"] for st in reversed(thresholds) if st["value"] is None or v >= st["value"]),
                    "green",
                )
                _rect(ax, x - 0.003, y - step * 0.45, w - 0.004, step * 0.9, _named(color))
            ax.text(
                x,
                y,
                clip(cells[j][i], widths[i]),
                color=TEXT,
                fontsize=6.5,
                va="center",
                transform=ax.transAxes,
                clip_on=True,
            )
        x += w
    if len(body) > len(shown):
        ax.text(
            0.99,
            0.01,
            f"+{len(body) - len(shown)} rows",
            color=DIM,
            fontsize=6,
            ha="right",
            transform=ax.transAxes,
        )


def _rect(ax, x, y, w, h, color, alpha=0.55):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, color=color, alpha=alpha, transform=ax.transAxes, clip_on=False))


def _named(c: str) -> str:
    return {"green": "#37872d", "red": "#c4162a", "orange": "#fa6400", "yellow": "#e0b400"}.get(c, c)


def draw_stat(ax, panel, results):
    ax.axis("off")
    values = [v[-1] for _t, res in results for s in res.series for v in s.values[-1:]]
    unit = panel["fieldConfig"]["defaults"].get("unit")
    if not values:
        ax.text(
            0.5, 0.45, "No data", color=DIM, fontsize=12, ha="center", va="center", transform=ax.transAxes
        )
        return
    v = values[0]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colour = TEXT
    if panel["options"].get("colorMode") == "background" and isinstance(v, int | float):
        colour = _named(
            next(st["color"] for st in reversed(steps) if st["value"] is None or v >= st["value"])
        )
        _rect(ax, 0, 0, 1, 1, colour, alpha=0.8)
        colour = "white"
    text = fmt(v, unit) if unit != "string" else str(v)
    ax.text(
        0.5,
        0.42,
        text,
        color=colour if colour != TEXT else "#73bf69",
        fontsize=20,
        fontweight="bold",
        ha="center",
        va="center",
        transform=ax.transAxes,
    )


def _is_dashed(panel, name: str) -> str | None:
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"]["id"] == "byRegexp" and re.search(o["matcher"]["options"].strip("/"), name):
            color = next((p["value"]["fixedColor"] for p in o["properties"] if p["id"] == "color"), "red")
            return {"red": "#f2495c", "blue": "#5794f2"}.get(color, color)
    return None


def draw_timeseries(ax, panel, results, width_px):
    import matplotlib.dates as mdates
    import numpy as np

    unit = panel["fieldConfig"]["defaults"].get("unit")
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    bars = custom.get("drawStyle") == "bars"
    lines = []
    for t, res in results:
        for s in res.series:
            cols = [c for c in s.columns if c != "time"]
            for ci, c in enumerate(cols, 1):
                pts = [(v[0], v[ci]) for v in s.values if v[ci] is not None and not isinstance(v[ci], str)]
                if pts:
                    lines.append((label(t, s, c), pts))
    if not lines:
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
    base: dict[int, float] = {}
    k = 0
    for name, pts in lines:
        xs = np.array([datetime.fromtimestamp(p[0] / 1000, UTC) for p in pts])
        ys = np.array([float(p[1]) for p in pts])
        dashed = _is_dashed(panel, name)
        if dashed:
            ax.plot(xs, ys, color=dashed, linestyle="--", linewidth=1.4, label=name)
            continue
        color = COLORS[k % len(COLORS)]
        k += 1
        if stacked:
            b = np.array([base.get(p[0], 0.0) for p in pts])
            if bars:
                ax.bar(xs, ys, bottom=b, color=color, width=0.0015, label=name)
            else:
                ax.fill_between(xs, b, b + ys, color=color, alpha=0.35, linewidth=0)
                ax.plot(xs, b + ys, color=color, linewidth=1, label=name)
            for p, y in zip(pts, ys, strict=True):
                base[p[0]] = base.get(p[0], 0.0) + y
        else:
            ax.plot(xs, ys, color=color, linewidth=1, label=name)
    lows = [min(float(p[1]) for p in pts) for _, pts in lines]
    if lines and unit in ("percentunit", "watt", "bytes", "short", "cpm", "joule") and min(lows) >= 0:
        ax.set_ylim(bottom=0)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=UTC))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=max(3, int(width_px / 120))))
    ax.yaxis.set_major_formatter(lambda v, _pos: fmt(v, unit))
    ax.tick_params(colors=DIM, labelsize=6.5)
    ax.grid(color=GRID, linewidth=0.5)
    for sp in ax.spines.values():
        sp.set_visible(False)
    if lines:
        n = len(lines)
        ax.legend(
            fontsize=6,
            loc="upper left",
            ncol=min(4, max(1, n // 3)),
            frameon=False,
            labelcolor=TEXT,
            handlelength=1.2,
            columnspacing=0.8,
            borderaxespad=0.2,
        ) if n <= 12 else ax.text(
            0.99, 0.97, f"{n} series", color=DIM, fontsize=6.5, ha="right", va="top", transform=ax.transAxes
        )


def draw_heatmap(ax, panel, results, from_ms, to_ms):
    import numpy as np

    pts = [(v[0], v[1]) for _t, res in results for s in res.series for v in s.values if v[1] is not None]
    if not pts:
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
        return
    times = np.array([p[0] for p in pts], dtype=float)
    vals = np.array([p[1] for p in pts], dtype=float)
    size = float(panel["options"].get("calculation", {}).get("yBuckets", {}).get("value", 2))
    lo, hi = np.floor(vals.min() / size) * size, np.ceil((vals.max() + size) / size) * size
    tbins = np.linspace(from_ms, to_ms, 90)
    h, _, _ = np.histogram2d(times, vals, bins=[tbins, np.arange(lo, hi + size, size)])
    ax.imshow(
        np.power(h.T, 0.5),
        origin="lower",
        aspect="auto",
        cmap="turbo",
        interpolation="nearest",
        extent=[0, 1, lo, hi],
    )
    ticks = np.linspace(0, 1, 6)
    ax.set_xticks(
        ticks,
        [
            datetime.fromtimestamp((from_ms + t * (to_ms - from_ms)) / 1000, UTC).strftime("%H:%M")
            for t in ticks
        ],
    )
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:.0f} °C")
    ax.tick_params(colors=DIM, labelsize=6.5)
    for sp in ax.spines.values():
        sp.set_visible(False)


def draw_bargauge(ax, panel, results):
    items = [
        (label(t, s, "count"), sum(v[1] or 0 for v in s.values)) for t, res in results for s in res.series
    ]
    ax.axis("off")
    if not items:
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
        return
    top = max(v for _, v in items) or 1
    n = len(items)
    for i, (name, v) in enumerate(items):
        y = 1 - (i + 0.5) / n
        ax.text(0.0, y, name, color=TEXT, fontsize=7, va="center", transform=ax.transAxes)
        _rect(ax, 0.32, y - 0.3 / n, 0.58 * v / top, 0.6 / n, COLORS[i % len(COLORS)], alpha=0.9)
        ax.text(
            0.99, y, fmt(v, "short"), color=TEXT, fontsize=7, va="center", ha="right", transform=ax.transAxes
        )


def render(dash: dict, runner: Runner, out: Path, width_in: float = 18.0) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dash["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_px = width_in * 100
    col_px = width_px / 24
    header_px = 60
    height_px = rows * ROW_PX + header_px
    fig = plt.figure(figsize=(width_in, height_px / 100), dpi=100, facecolor=BG)
    ctx = runner.ctx
    period = (
        f"{datetime.fromtimestamp(ctx.from_ms / 1000, UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(ctx.to_ms / 1000, UTC):%H:%M} UTC"
    )
    chosen = "   ".join(
        f"{k}: {v.value if isinstance(v.value, str) else '+'.join(v.value)}".replace("$__all", "All")
        for k, v in ctx.variables.items()
    )
    fig.text(
        0.006, 1 - 22 / height_px, dash["title"], color=TEXT, fontsize=13, fontweight="bold", va="center"
    )
    fig.text(0.006, 1 - 46 / height_px, f"{chosen}    {period}", color=DIM, fontsize=8, va="center")
    results: dict[int, list[tuple[dict, Result]]] = {}
    for p, t, res in runner.run_all():
        results.setdefault(p["id"], []).append((t, res))
    for p in panels:
        g = p["gridPos"]
        x0, w = g["x"] * col_px + 3, g["w"] * col_px - 6
        y_top = header_px + g["y"] * ROW_PX + 3
        h = g["h"] * ROW_PX - 6
        if p["type"] == "row":
            fig.text(
                (x0 + 4) / width_px,
                1 - (y_top + h / 2) / height_px,
                p["title"],
                color=TEXT,
                fontsize=10,
                fontweight="bold",
                va="center",
            )
            continue
        frame = fig.add_axes([x0 / width_px, 1 - (y_top + h) / height_px, w / width_px, h / height_px])
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for sp in frame.spines.values():
            sp.set_color(GRID)
        frame.text(
            8 / w,
            1 - 11 / h,
            p["title"],
            color=TEXT,
            fontsize=8,
            fontweight="bold",
            va="center",
            transform=frame.transAxes,
            clip_on=True,
        )
        inner_top = 24
        pad_l = 52 if p["type"] in ("timeseries", "heatmap") else 8
        pad_b = 18 if p["type"] in ("timeseries", "heatmap") else 4
        ax = fig.add_axes(
            [
                (x0 + pad_l) / width_px,
                1 - (y_top + h - pad_b) / height_px,
                (w - pad_l - 8) / width_px,
                (h - inner_top - pad_b) / height_px,
            ]
        )
        ax.set_facecolor(PANEL)
        res = results.get(p["id"], [])
        if p["type"] == "timeseries":
            draw_timeseries(ax, p, res, w)
        elif p["type"] == "stat":
            draw_stat(ax, p, res)
        elif p["type"] == "table":
            draw_table(ax, p, res, h - inner_top, w - 16)
        elif p["type"] == "heatmap":
            draw_heatmap(ax, p, res, ctx.from_ms, ctx.to_ms)
        elif p["type"] == "bargauge":
            draw_bargauge(ax, p, res)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # date locator notes on short ranges
        fig.savefig(out, facecolor=BG)
    plt.close(fig)
    return out


def render_all(
    query: QueryFn,
    from_ms: int,
    to_ms: int,
    out_dir: Path,
    selections: dict[str, dict] | None = None,
    names: list[str] | None = None,
) -> list[Path]:
    """One ``dash-<name>.png`` per dashboard; ``selections[name]`` sets its variables (else All/first)."""
    paths = []
    for name, dash in generate.build_all().items():
        if names and name not in names:
            continue
        runner = Runner(dash, query, from_ms, to_ms, (selections or {}).get(name, {}))
        paths.append(render(dash, runner, Path(out_dir) / f"dash-{name}.png"))
    return paths
