"""Link degradation judged from rates: PCIe link error rates against the background healthy H100/H200
links showed, and an NVLink link's throughput against its sibling links'."""

from __future__ import annotations

import re

import pytest
from gpufleet.analyzer.config import Config

from tests.fleets import STEP, T0, analyse, fleet

SLOW_EVERY = 6  # the slow tier: every 60 s at the 10 s poll


def _step(line: str) -> int:
    return (int(line.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP


def _with_pcie_errors(data: bytes, per_step: dict, bad=None, bad_per_step=None, from_step=100) -> bytes:
    """Every GPU row of a slow poll gains the PCIe link error counters, growing by ``per_step`` (field
    -> errors per 10 s poll); GPU ``bad`` = (node, gpu) grows by ``bad_per_step`` from ``from_step``."""
    totals: dict = {}
    out = []
    for ln in data.decode().splitlines():
        s = _step(ln) if ln else -1
        if ln.startswith("gpu,") and s % SLOW_EVERY == 0:
            key = re.search(r"host=(\w+),", ln).group(1), re.search(r",gpu=(\d+)", ln).group(1)
            tot = totals.setdefault(key, {f: 1000 for f in {**per_step, **(bad_per_step or {})}})
            is_bad = bad is not None and key == (f"node{bad[0]}", str(bad[1])) and s >= from_step
            more = bad_per_step if is_bad else {}
            for f in tot:  # counts since driver load, SLOW_EVERY polls' worth more each slow poll
                tot[f] += SLOW_EVERY * (per_step.get(f, 0) + more.get(f, 0))
            extra = ",".join(f"{f}={v}i" for f, v in tot.items())
            head, rest = ln.split(" ", 1)
            fields, t = rest.rsplit(" ", 1)
            ln = f"{head} {fields},{extra} {t}"
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


# the worst background the recordings show: an H200's counters over 15 min (docs/analyzer.md): L0 ->
# recovery ~17/min, receiver + bad TLP + NAKs sent + bad DLLP ~17/min; per 10 s poll:
HEALTHY = {
    "pcie_l0_to_recovery_total": 3,
    "pcie_receiver_errors_total": 1,
    "pcie_bad_tlp_total": 1,
    "pcie_naks_sent_total": 1,
}
# a link erring ~4x a second on receiver errors and NAKs, no replay counted, full width and gen
ERRING = {"pcie_receiver_errors_total": 20, "pcie_naks_sent_total": 20}


@pytest.mark.slow
def test_healthy_pcie_link_error_background_stays_quiet():
    incs = analyse(_with_pcie_errors(fleet(), HEALTHY)).incidents()
    assert incs == [], [i.summary for i in incs]


@pytest.mark.slow
def test_pcie_link_error_rate_alone_opens_an_incident():
    data = _with_pcie_errors(fleet(), HEALTHY, bad=(2, 1), bad_per_step=ERRING)
    incs = analyse(data).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("pcie_degradation", "node2", 1)]
    ev = incs[0].evidence
    assert "pcie_link_errors" in ev["signals"] and "pcie_replay_total" not in ev["signals"]
    assert ev["first"]["link_errors_per_min"] >= 120 and ev["first"]["width"] == 16
    # the new evidence is what decided: with the rule off the same data pages nobody
    cfg = Config()
    cfg.detectors["pcie_degradation"]["link_errors_per_minute"] = 1e12
    assert analyse(data, cfg).incidents() == []


@pytest.mark.slow
def test_pcie_retraining_storm_opens_an_incident():
    data = _with_pcie_errors(
        fleet(), HEALTHY, bad=(0, 3), bad_per_step={"pcie_l0_to_recovery_total": 60}, from_step=200
    )
    incs = analyse(data).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("pcie_degradation", "node0", 3)]
    assert "pcie_l0_to_recovery" in incs[0].evidence["signals"]
    assert T0 + 200 * STEP <= incs[0].start <= T0 + 260 * STEP


LINK_BPS = 5e9  # each way per link under load (an H100 NVLink 4 link: 25 GB/s each way)


def _with_link_traffic(data: bytes, slow=None, share=0.1, crc_every=None, from_step=100) -> bytes:
    """Every link row gains tx/rx byte counters: LINK_BPS each way while the fleet is under load
    (``fleet``: 30 min of work, 10 idle), nothing idle. Link ``slow`` = (node, gpu, link) carries
    ``share`` of that from ``from_step`` and, with ``crc_every``, takes a CRC error every that many
    polls (a rate far below the CRC rules' bars)."""
    tot: dict = {}
    out = []
    for ln in data.decode().splitlines():
        if ln.startswith("gpu_nvlink,"):
            s = _step(ln)
            key = tuple(re.search(p, ln).group(1) for p in (r"host=(\w+),", r",gpu=(\d+)", r",link=(\d+)"))
            want = None if slow is None else (f"node{slow[0]}", str(slow[1]), str(slow[2]))
            bad = key == want and s >= from_step
            load = (s // 60) % 4 != 3
            b = tot.get(key, 7 * 2**40) + int(LINK_BPS * STEP * load * (share if bad else 1.0)) // 1024 * 1024
            tot[key] = b
            if bad and crc_every:
                n = (s - from_step) // crc_every
                ln = ln.replace("crc_flit_errors_total=0i", f"crc_flit_errors_total={n}i")
            head, rest = ln.split(" ", 1)
            fields, t = rest.rsplit(" ", 1)
            ln = f"{head} {fields},tx_data_bytes_total={b}i,rx_data_bytes_total={b}i {t}"
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


@pytest.mark.slow
def test_link_slow_against_its_busy_siblings_with_errors_opens_a_warning():
    # link 2 carries a tenth of its siblings' traffic and takes a CRC error every 5 min: 3 in 15 min,
    # far below the slow-growth bar (45) and with no replay; the CRC rules alone stay quiet
    data = _with_link_traffic(fleet(links=4), slow=(1, 3, 2), crc_every=30)
    incs = analyse(data).incidents()
    assert [(i.kind, i.host, i.gpu, i.link, i.severity) for i in incs] == [
        ("nvlink_degradation", "node1", 3, 2, "warning")
    ], [i.summary for i in incs]
    first = incs[0].evidence["first"]
    assert first["signals"] == ["low_throughput"], first
    assert first["throughput_bytes_per_s"] < 0.5 * first["siblings_median_bytes_per_s"]
    assert T0 + 100 * STEP <= incs[0].start <= T0 + 100 * STEP + 1200
    # the throughput is what decided: without the sibling rule the same data pages nobody
    cfg = Config()
    cfg.detectors["nvlink_degradation"]["throughput_ratio"] = 0.0
    assert analyse(data, cfg).incidents() == []


@pytest.mark.slow
def test_link_idle_while_its_siblings_are_busy_without_errors_stays_quiet():
    # a link the job's traffic pattern does not use: no errors, no incident
    data = _with_link_traffic(fleet(links=4), slow=(1, 3, 2), share=0.0)
    assert analyse(data).incidents() == []
    # and a healthy fleet's links, all carrying the same traffic, busy and idle together
    assert analyse(_with_link_traffic(fleet(links=4))).incidents() == []


def _mixed_link_background(data: bytes, rng, bad_from: int) -> bytes:
    """Nodes 0 and 1 become A100s whose healthy links take CRC errors at ~0.2/s each (a noisier
    generation's background); node3 GPU 1 link 0, an H200's, takes 2/s from step ``bad_from``."""
    totals: dict = {}
    out = []
    for ln in data.decode().splitlines():
        node = re.search(r"host=node(\d+),", ln)
        if node and int(node.group(1)) < 2:
            ln = ln.replace("model=NVIDIA\\ H200", "model=NVIDIA\\ A100-SXM4-80GB")
        if ln.startswith("gpu_nvlink,"):
            key = (node.group(1), re.search(r",gpu=(\d+)", ln).group(1),
                   re.search(r",link=(\d+)", ln).group(1))
            more = int(rng.poisson(2.0)) if int(key[0]) < 2 else 0
            if key == ("3", "1", "0") and _step(ln) >= bad_from:
                more += 20
            totals[key] = totals.get(key, 0) + more
            ln = ln.replace("crc_flit_errors_total=0i", f"crc_flit_errors_total={totals[key]}i")
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


def test_nvlink_rates_are_judged_against_the_links_of_the_gpus_own_model():
    """A mixed fleet: the A100s' links run a CRC background of ~0.2/s (theirs, not a fault), the H200s'
    none. An H200 link at 2/s is paged against the H200s' rate (a fleet-wide rate, lifted by the
    A100s' background to 20 x ~0.3/s, would hide it), and no A100 link is paged."""
    import numpy as np

    data = _mixed_link_background(fleet(nodes=4, gpus=4, steps=360, links=2), np.random.default_rng(5),
                                  bad_from=150)
    an = analyse(data)
    nv = [r for r in an.incidents() if r.kind == "nvlink_degradation"]
    assert [(r.host, r.gpu, r.link) for r in nv] == [("node3", 1, 0)], [r.summary for r in nv]
    ev = nv[0].evidence["peak"]
    assert ev["crc_threshold_per_s"] == 1.0  # the H200s' links: no background, the floor
    det = next(d for d in an.detectors if d.kind == "nvlink_degradation")
    assert det.fleet_crc_rate_ > 0.05 and sorted(det.model_crc_rate_.values())[0] == 0.0


def _slow_link_lines(onset: int) -> list[str]:
    """The fleet with link 1 of node1 GPU 2 taking a CRC error every 10 s poll from ``onset``."""
    lines = []
    for ln in fleet(steps=240, fault=("nvlink_degradation", 1, 2, onset)).decode().splitlines():
        m = re.search(r"crc_flit_errors_total=(\d+)i", ln)
        if m and ln.startswith("gpu_nvlink,"):  # the fleet's faulty link grows by 5 a poll: 1 here
            ln = ln.replace(m.group(0), f"crc_flit_errors_total={int(m.group(1)) // 5}i")
        lines.append(ln)
    return lines


def test_a_link_erring_slowly_is_judged_over_its_whole_span_online_as_in_batch(tmp_path):
    """A link taking a CRC error every 10 s (0.1/s: 45 within 15 min after 450 s, the slow-growth
    bar) is paged when its 45th error lands, in batch and online at 30 s polls alike. The span (15
    min) is longer than a window's context (5 min): before, an online table (a poll and its context)
    held at most 33 of them and never paged it."""
    from tests.arrival import lines_of, replay

    onset = 100
    data = ("\n".join(_slow_link_lines(onset)) + "\n").encode()
    (tmp_path / "f.lp").write_bytes(data)
    batch = analyse(data).incidents()
    on = replay(lines_of(tmp_path / "f.lp"), lambda t, _h, _i: t + 1.0, poll=30.0)
    on.an.finish()
    online = [r for r in on.an.incidents() if r.kind == "nvlink_degradation"]
    for incs in (batch, online):
        got = [(r.kind, r.host, r.gpu, r.link) for r in incs]
        assert got == [("nvlink_degradation", "node1", 2, 1)], incs
        assert incs[0].evidence["first"]["crc_errors_in_span"] == 45
        assert abs(incs[0].start - (T0 + (onset + 45) * STEP)) <= STEP


def test_a_link_erring_slowly_inside_its_host_s_cut_is_paged_from_the_backlog_with_its_true_start(tmp_path):
    """The same link, its node cut off from 900 to 2000 s: the node's rows after the cut land on
    time, its backlog 100 s later (a writer that sends its live rows first). The backlog's rows are
    analysed after the newer live ones, and each late window still counts the link's errors of the
    windows before it: paged with batch's start (the 45th error, 1,450 s in)."""
    from tests.arrival import lines_of, replay

    onset = 100
    (tmp_path / "f.lp").write_text("\n".join(_slow_link_lines(onset)) + "\n")

    def arrive(t, host, _i):
        return T0 + 2100.5 if host == b"node1" and 900 <= t - T0 < 2000 else t + 1.0

    on = replay(lines_of(tmp_path / "f.lp"), arrive, poll=30.0)
    on.an.finish()
    got = [(r.kind, r.host, r.gpu, r.link) for r in on.an.incidents() if r.kind == "nvlink_degradation"]
    assert got == [("nvlink_degradation", "node1", 2, 1)], got
    inc = [r for r in on.an.incidents() if r.kind == "nvlink_degradation"][0]
    assert abs(inc.start - (T0 + (onset + 45) * STEP)) <= STEP, inc.start - T0
    assert on.an.late_rows > 0 and on.an.dropped_rows == 0
