"""Gaps are gaps: a counter's change across a stretch of missing rows happened somewhere in it.

Its increase is never a rate at the first row after the gap (no single-bit storm, no NVLink CRC
burst made of what a silent GPU collected over ten minutes), while a counter that pages on any
step (the uncorrectable ECC count) still pages once, its evidence naming the gap."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpufleet.analyzer.frame import Table

from tests.arrival import replay
from tests.fleets import STEP, T0, analyse, fleet

NODE, GPU = 1, 2
GAPS = {"10min": range(200, 260), "4min": range(200, 224)}  # steps missing (10 s polls)


def gapped(gap: range | None, bump: dict | None = None, at: int | None = None) -> bytes:
    """The detectors' reference fleet with node1 GPU 2's gpu and NVLink rows missing over ``gap``
    (steps); ``bump``: {counter: increase} on that GPU from step ``at`` on (default: the gap's
    middle, so the counter rises while nothing is reported)."""
    at = (gap.start + gap.stop) // 2 if at is None else at
    out = []
    for ln in fleet(steps=480).decode().splitlines():
        if ln.startswith(("gpu,", "gpu_nvlink,")) and f",gpu={GPU},host=node{NODE}," in ln:
            s = (int(ln.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP
            if gap is not None and s in gap:
                continue
            if s >= at:
                for f, add in (bump or {}).items():
                    ln = re.sub(rf"([ ,]{f}=)(\d+)i", lambda m, a=add: f"{m[1]}{int(m[2]) + a}i", ln)
        out.append(ln)
    return ("\n".join(out) + "\n").encode()


def faults(incs, kinds=("memory_errors", "nvlink_degradation", "pcie_degradation")):
    return [i for i in incs if i.kind in kinds]


@pytest.mark.parametrize("gap", list(GAPS), ids=list(GAPS))
@pytest.mark.slow
def test_counters_rising_across_a_gap_are_no_rate_spike(gap):
    # 20 corrected ECC errors and 60 NVLink CRC errors collected while the GPU was silent: as a
    # step at the first row back they read as a single-bit storm (20 in 2 min) and a link piling
    # up CRC errors (60 in the span); spread over the gap they are background
    # and 30 PCIe replays: at most 0.12/s over the gap, within the allowance (8/min at gen 5 x16)
    bump = {"ecc_corrected_volatile_total": 20, "crc_flit_errors_total": 60, "pcie_replay_total": 30}
    incs = analyse(gapped(GAPS[gap], bump)).incidents()
    assert faults(incs) == [], [i.summary for i in incs]
    # the same increases between adjacent rows are the storm and the bursts (the test can fail)
    burst = faults(analyse(gapped(None, bump, at=230)).incidents())
    assert {i.kind for i in burst} == {"memory_errors", "nvlink_degradation", "pcie_degradation"}, [
        i.summary for i in burst]


@pytest.mark.slow
def test_rates_above_the_bar_even_averaged_over_the_gap_page_naming_the_gap():
    # 6000 PCIe replays and 100k NVLink CRC errors in 10 min: even spread over the gap, ~10
    # replays/s and ~160 CRC errors/s, far above the bars (a lower bound of the rate inside it)
    steps = GAPS["10min"]
    data = gapped(steps, {"pcie_replay_total": 6000, "crc_flit_errors_total": 100_000})
    incs = faults(analyse(data).incidents())
    back = T0 + steps.stop * STEP
    got = sorted((i.kind, i.link) for i in incs if i.start == back)
    assert got == [("nvlink_degradation", 0), ("nvlink_degradation", 1), ("pcie_degradation", None)], [
        (i.kind, i.link, i.start, i.summary) for i in incs]
    for i in incs:
        first = i.evidence["first"]
        assert first["over_gap_seconds"] == 610, i.summary
        if i.kind == "pcie_degradation":
            assert first["replays_over_gap"] == 6000 and first["replay_rate_per_s"] is None
        else:
            assert first["crc_errors_over_gap"] == 100_000 and first["crc_rate_per_s"] is None


@pytest.mark.parametrize("gap", list(GAPS), ids=list(GAPS))
@pytest.mark.slow
def test_uncorrectable_error_across_a_gap_pages_once_naming_the_gap(gap):
    steps = GAPS[gap]
    incs = faults(analyse(gapped(steps, {"ecc_uncorrected_volatile_total": 1})).incidents())
    assert [(i.kind, i.host, i.gpu, i.severity) for i in incs] == [
        ("memory_errors", f"node{NODE}", GPU, "critical")], [i.summary for i in incs]
    first = incs[0].evidence["first"]
    back = T0 + steps.stop * STEP  # the first row after the gap
    assert incs[0].start == back and first["new_dbe"] == 1
    assert first["over_gap_seconds"] == (len(steps) + 1) * STEP  # from the last row before it
    # no rate is made of it
    assert first.get("sbe_rate_per_s") is None


@pytest.mark.slow
def test_uncorrectable_error_between_adjacent_rows_names_no_gap():
    incs = faults(analyse(gapped(None, {"ecc_uncorrected_volatile_total": 1}, at=230)).incidents())
    assert [(i.kind, i.severity) for i in incs] == [("memory_errors", "critical")]
    assert incs[0].start == T0 + 230 * STEP and "over_gap_seconds" not in incs[0].evidence["first"]


@pytest.mark.slow
def test_online_in_time_order_pages_the_error_across_a_gap_as_batch_does():
    data = gapped(GAPS["10min"], {"ecc_uncorrected_volatile_total": 1, "ecc_corrected_volatile_total": 20})
    online = replay(_lines(data), lambda t, _h, _i: t + 1.0, poll=10.0)
    incs = faults(online.an.incidents())
    assert [(i.kind, i.host, i.gpu, i.severity, i.start) for i in incs] == [
        ("memory_errors", f"node{NODE}", GPU, "critical", T0 + 260 * STEP)], [i.summary for i in incs]
    assert incs[0].evidence["first"]["over_gap_seconds"] == 610


def _lines(data: bytes):
    out = []
    for ln in data.splitlines():
        host = re.search(rb"[ ,]host=([^, ]+)", ln).group(1)
        out.append((int(ln.rsplit(b" ", 1)[1]), host, ln))
    return out


@pytest.mark.slow
def test_a_node_cut_off_is_no_gap_its_rows_come_late():
    # the whole node silent for 10 min, its rows spooled and sent a minute after it is back: not a
    # gap in its data but data arriving late. The error is found in the node's own time (its true
    # start, said late), never bridged from the node's last row before the cut
    lines = _lines(gapped(None, {"ecc_uncorrected_volatile_total": 1}, at=230))
    cut0, cut1 = T0 + 200 * STEP, T0 + 260 * STEP
    online = replay(lines, lambda t, h, _i: cut1 + 65.0 if h == b"node1" and cut0 <= t < cut1 else t + 1.0)
    incs = faults(online.an.incidents())
    assert [(i.kind, i.host, i.gpu, i.start) for i in incs] == [
        ("memory_errors", f"node{NODE}", GPU, T0 + 230 * STEP)]
    assert incs[0].evidence.get("arrived_late") and "over_gap_seconds" not in incs[0].evidence["first"]


def test_table_gap_is_judged_against_the_entity_own_poll():
    # entity 0: 10 s polls with one 600 s hole; entity 1: 60 s polls (its own pace, no gap);
    # entity 2: two rows only, 300 s apart (judged against the table's 10 s polls: a gap)
    t0 = [0, 10, 20, 30, 40, 640, 650, 660]
    t1 = [0, 60, 120, 180, 240, 300]
    t2 = [0, 300]
    ent = np.array([0] * len(t0) + [1] * len(t1) + [2] * len(t2))
    t = np.array(t0 + t1 + t2) * 10**9
    c = np.array([0, 1, 2, 3, 4, 50, 51, 52, 0, 6, 12, 18, 24, 30, 0, 9], float)
    tab = Table.build(ent, t, {"c": c})
    gap = tab.gap()
    assert np.flatnonzero(~np.isnan(gap)).tolist() == [5, 15] and gap[5] == 600 and gap[15] == 300
    with np.errstate(invalid="ignore"):
        d = tab.delta("c")
    assert np.isnan(d[[0, 5, 8, 14, 15]]).all() and d[6] == 1 and d[9] == 6
    assert tab.increase("c")[5] == 0 and tab.increase("c", gaps=True)[5] == 46
    assert tab.dt()[5] == 600  # the time itself is the time
    # a pair of rows with the hole between them spans the gap; one after it does not
    assert tab.spans_gap(np.array([5, 7]), np.array([3, 5])).tolist() == [True, False]


def test_table_without_a_gap_differences_every_row_as_before():
    rng = np.random.default_rng(3)
    ent = np.repeat(np.arange(5), 40)
    t = (np.tile(np.arange(40) * 10.0, 5) + rng.uniform(-1, 1, 200)) * 1e9
    c = np.cumsum(rng.integers(0, 3, 200)).astype(float)
    tab = Table.build(ent, t.astype(np.int64), {"c": c})
    assert np.isnan(tab.gap()).all()
    d = tab.delta("c")
    assert np.isnan(d[tab.first_of_entity()]).all() and np.isfinite(d[~tab.first_of_entity()]).all()
