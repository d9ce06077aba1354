"""Incident pages: content, plots from line-protocol telemetry, and rendering in real headless Chromium."""

from __future__ import annotations

import gzip
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gpufleet.analyzer.alerting import write_pages

from gpufleet import records
from gpufleet.cli import main
from gpufleet.lineprotocol import encode
from tests.alerting_receiver import T0, incident

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
START, HOT = T0 - 1800, (T0, T0 + 600)  # telemetry from 30 min before; GPU 2 hot for 10 min


def telemetry(path: Path, gpus: int = 4, step: int = 10) -> Path:
    """Half an hour either side of T0 for one node in the catalogue schema, as .lp.gz."""
    lines = []
    thr = [0] * gpus
    nvl = [[0] * 4 for _ in range(gpus)]
    for i, t in enumerate(range(int(START), int(T0 + 1800), step)):
        ns = t * 10**9
        for g in range(gpus):
            hot = g == 2 and HOT[0] <= t < HOT[1]
            temp = 62 + g + 3 * math.sin(i / 9 + g) + (28 if hot else 0)
            if hot:
                thr[g] += int(0.6 * step * 1e9)
            tags = {"host": "node01", "gpu": g, "uuid": f"GPU-{g:08d}", "model": "NVIDIA H200",
                    "cluster": "c1", "rack": "r07"}
            lines.append(encode("gpu", tags, {
                "temperature_gpu_celsius": int(temp), "power_watts": 690.0 - (250 if hot else 0) + g,
                "clock_sm_mhz": 1500 - (600 if hot else 0), "throttle_hw_thermal_ns_total": thr[g],
                "utilization_gpu_ratio": 0.97, "up": 1}, ns))
            for link in range(4):
                bad = g == 1 and link == 3 and t >= T0
                nvl[g][link] += (40 * step if bad else 0)
                lines.append(encode("gpu_nvlink", {**tags, "link": link},
                                    {"up": 1, "replay_errors_total": nvl[g][link], "crc_flit_errors_total": 0,
                                     "crc_data_errors_total": 0, "recovery_errors_total": 0}, ns))
            if i % 6 == 0:
                bad = g == 0 and t >= T0
                lines.append(encode("gpu_canary", tags, {"passed": 0 if bad else 1,
                                                         "mismatches": 17 if bad else 0,
                                                         "duration_seconds": 0.2}, ns))
    lines.append(encode("gpu_event", {"host": "node01", "gpu": 0, "type": "xid", "source": "nvml"},
                        {"code": 94, "message": "Contained ECC error <row 12>"}, int(T0 + 30) * 10**9))
    lines.append("garbage line that does not parse")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


def sample_incidents():
    return [
        incident(kind="thermal_throttle", gpu=2, start=HOT[0], end=HOT[1], id="thermal-1",
                 summary="GPU 2 <b>thermal</b> throttling & slowed",
                 detail="HW thermal slowdown 60% of time.",
                 evidence={"temperature_gpu_celsius": 92.0, "threshold": {"slowdown_celsius": 89},
                           "peers_median_celsius": 63.5}),
        incident(kind="nvlink_degradation", gpu=1, link=3, start=T0, end=None, id="nvl-1",
                 severity="warning", evidence={"replay_errors_per_s": 40.0}),
        incident(kind="sdc", gpu=0, start=T0, id="sdc-1", evidence={"mismatches": 17}, jobs=["4242", "4243"]),
        incident(kind="cooling_degradation", gpu=None, start=T0 - 600, end=T0 + 900, severity="warning"),
    ]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    data = telemetry(d / "fleet.lp.gz")
    inc = d / "incidents.jsonl"
    records.write(inc, sample_incidents())
    rc = main(["report", "--incidents", str(inc), "--input", str(d), "--out", str(d / "out"),
               "--page-base-url", "https://pages.example/gpufleet/"])
    assert rc == 0
    return d, data, sorted((d / "out").glob("*.html"))


@pytest.mark.slow
def test_a_page_per_incident_plus_index(pages):
    d, _, paths = pages
    names = [p.name for p in paths]
    assert "index.html" in names and len(paths) == 5
    index = (d / "out" / "index.html").read_text()
    for p in paths:
        if p.name != "index.html":
            assert f'href="{p.name}"' in index
    thermal = next(p for p in paths if "thermal-1" in p.name).read_text()
    assert "GPU 2 &lt;b&gt;thermal&lt;/b&gt; throttling &amp; slowed" in thermal  # escaped
    assert "<b>thermal" not in thermal
    assert "<td>threshold.slowdown_celsius</td><td>89</td>" in thermal
    assert "<td>temperature_gpu_celsius</td><td>92</td>" in thermal
    assert re.search(r'src="data:image/png;base64,[A-Za-z0-9+/=]{2000,}"', thermal)
    assert "https://pages.example/gpufleet/incident-thermal-1-" in thermal
    assert "http" not in re.sub(r"https://pages\.example/gpufleet/\S+", "", thermal)  # self-contained
    # the page leads with what is wrong, where, job, since, impact, action and runbook; then the
    # plot, the GPU's history, and the evidence folded away
    order = ["<h1>", "node01 GPU 2 is thermal throttling", ">Job<", ">Since<", ">Impact<",
             'id="action">Compare its inlet', 'id="runbook" href="runbooks/thermal_throttle.md"',
             'id="signals"', "History of this GPU", "runs hotter than its power",
             '<details id="evidence">', "threshold.slowdown_celsius"]
    body = thermal[thermal.index("<body>"):]
    pos = [body.find(s) for s in order]
    assert all(p >= 0 for p in pos) and pos == sorted(pos), list(zip(order, pos, strict=True))
    assert thermal.index("</details>") > thermal.index("<td>temperature_gpu_celsius</td>")
    # the runbooks travel with the pages: every page's runbook link names a file beside it
    for p in paths:
        for href in re.findall(r'id="runbook" href="([^"]+)"', p.read_text()):
            assert (p.parent / href).is_file(), href
    sdc = next(p for p in paths if "sdc-1" in p.name).read_text()
    assert "Contained ECC error &lt;row 12&gt;" in sdc and "<td>94</td>" in sdc  # the XID in the window
    # ... named, with the XID catalogue's resolution in words
    assert "<td>Contained ECC error</td><td>Restart the application; the GPU itself is fine.</td>" in sdc
    assert ">4242, 4243<" in sdc  # the jobs on the GPU during the incident


@pytest.mark.slow
def test_pages_load_without_network_and_stay_small(pages):
    _, _, paths = pages
    for p in paths:
        html = p.read_text()
        assert p.stat().st_size <= 500_000, f"{p.name}: {p.stat().st_size} bytes"
        # nothing the browser would fetch: no external scripts, styles, images, fonts or frames
        assert not re.search(r"<(script|link|iframe|object|embed)\b", html, re.I)
        assert not re.search(r"\bsrc=\"(?!data:)", html) and "@import" not in html and "url(" not in html


@pytest.mark.slow
def test_plots_show_the_gpu_against_its_peers(pages):
    from gpufleet.analyzer.alerting.data import load
    from gpufleet.analyzer.alerting.pages import plot, window

    _, data, _ = pages
    r = sample_incidents()[0]
    lo, hi = window(r, None)
    series = load(data, {"node01"}, [(lo, hi)])
    assert series.skipped == 0  # the garbage line is not a gpu measurement: filtered before parsing
    temps = dict(series.data[("gpu", "node01", 2, None)])["temperature_gpu_celsius"]
    assert max(v for _, v in temps) >= 89 and len(series.keys("gpu", "node01")) == 4
    png = plot(r, series, lo, hi)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    nothing = plot(incident(kind="sdc", host="node99"), series, lo, hi)
    assert nothing is None


@pytest.mark.slow
def test_every_page_renders_in_headless_chromium_with_images_loaded(pages, tmp_path):
    _, _, paths = pages
    probe = ("<script>addEventListener('load',()=>{const ok=[...document.images].filter("
             "i=>i.complete&&i.naturalWidth>0).length;document.body.setAttribute('data-images',"
             "document.images.length+'/'+ok)})</script>")
    procs = []
    for p in paths:  # the page as written, plus a probe that reports what the browser decoded
        probe_page = tmp_path / p.name
        probe_page.write_text(p.read_text().replace("</body>", probe + "</body>"))
        procs.append((p, subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / ('prof-' + p.stem)}",
             "--virtual-time-budget=5000", "--dump-dom", probe_page.as_uri()],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)))
    for p, proc in procs:
        dom, _ = proc.communicate(timeout=60)
        m = re.search(r'data-images="(\d+)/(\d+)"', dom)
        assert m, f"{p.name}: Chromium did not load the page"
        total, ok = int(m.group(1)), int(m.group(2))
        assert total == ok, f"{p.name}: {ok} of {total} images decoded"
        if p.name != "index.html":
            assert total == 1, f"{p.name}: expected its signals plot"
    shot = tmp_path / "thermal.png"
    thermal = next(p for p in paths if "thermal-1" in p.name)
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'prof-shot'}", "--window-size=1100,1400",
                    f"--screenshot={shot}", thermal.as_uri()], check=True, timeout=60, capture_output=True)
    assert shot.stat().st_size > 20_000
    keep = Path("/tmp/gpufleet-report-screenshot.png")
    shutil.copy(shot, keep)


@pytest.mark.slow
def test_write_pages_accepts_points_and_handles_no_data(tmp_path):
    from gpufleet.lineprotocol import parse_line

    lines = gzip.open(telemetry(tmp_path / "t.lp.gz"), "rt").read().splitlines()[:-1]
    points = [parse_line(x) for x in lines]
    out = write_pages(sample_incidents()[:1], points, tmp_path / "o")
    assert len(out) == 2 and "data:image/png" in out[0].read_text()
    out = write_pages([incident(host="elsewhere", id="lonely")], points, tmp_path / "o2")
    assert "No telemetry for this GPU" in out[0].read_text()
    assert write_pages([], points, tmp_path / "o3")[-1].name == "index.html"


def test_plots_break_lines_at_a_gap_and_plot_no_rate_across_it(tmp_path):
    """node01 is silent for 10 min (T0 + 600 .. T0 + 1200) and GPU 1's PCIe replay counter rose by 6,000
    meanwhile (0.1/s before and after): the page's replay-rate line breaks over the gap, no rate is
    computed across it (10/s averaged over the outage is no measurement), and a value line breaks
    there too. A gap is the windows' own rule: more than 3 of the entity's median polls."""
    import matplotlib.image as mpimg
    import numpy as np
    from gpufleet.analyzer.alerting.data import load
    from gpufleet.analyzer.alerting.pages import _series, plot, window

    gap = (T0 + 600, T0 + 1200)  # right of the legend, in the upper left
    lines, replays = [], [0] * 4
    for t in range(int(START), int(T0 + 1800), 10):
        if gap[0] <= t < gap[1]:
            continue
        for g in range(4):
            replays[g] += 6000 if g == 1 and t == gap[1] else (1 if g == 1 else 0)
            tags = {"host": "node01", "gpu": g, "cluster": "c1", "rack": "r07"}
            lines.append(encode("gpu", tags, {"pcie_replay_total": replays[g], "pcie_link_width": 16,
                                              "pcie_link_gen": 5, "utilization_gpu_ratio": 0.97,
                                              "temperature_gpu_celsius": 60 + g}, t * 10**9))
    (tmp_path / "gap.lp").write_text("\n".join(lines) + "\n")
    r = incident(kind="pcie_degradation", gpu=1, start=T0, end=T0 + 600, id="pcie-gap")
    lo, hi = window(r, None)
    data = load(tmp_path / "gap.lp", {"node01"}, [(lo, hi)])
    pts = dict(data.data[("gpu", "node01", 1, None)])
    t, rate = _series(pts["pcie_replay_total"], "rate", lo, hi)
    assert np.nanmax(rate) == pytest.approx(0.1)  # never the 10/s over the gap
    inside = (t >= gap[0]) & (t <= gap[1])
    assert inside.sum() == 1 and np.isnan(rate[inside]).all()  # the break, at the row after the gap
    t, temp = _series(pts["temperature_gpu_celsius"], "value", lo, hi)
    inside = (t > gap[0] - 10) & (t < gap[1])
    assert inside.sum() == 1 and np.isnan(temp[inside]).all()  # one NaN point between the two sides
    assert np.isfinite(np.delete(temp, np.flatnonzero(inside))).all()
    # the page's picture: GPU 1's red rate line leaves the gap's columns blank (a quarter of the
    # window: ~170 px of the 810 px figure), where a line drawn across it would leave none
    png = tmp_path / "p.png"
    png.write_bytes(plot(r, data, lo, hi))
    img = mpimg.imread(png)[:, :, :3]
    red = (np.abs(img - np.array([214, 39, 40]) / 255).max(axis=2) < 0.08).any(axis=0)
    cols = np.flatnonzero(red)
    runs = np.diff(cols)
    assert runs.max() > 120, runs.max()
    out = write_pages([r], tmp_path / "gap.lp", tmp_path / "out")
    assert "data:image/png" in out[0].read_text()
