"""SimNode: one node of a simulated fleet, live, as the agent's sim backend sees it."""

from __future__ import annotations

import pytest

from gpufleet import catalogue
from gpufleet.errors import GpufleetError
from gpufleet.sim.node import SimNode

T0 = 1_800_000_000.0


def lost_host(node: SimNode) -> tuple[str, int, float]:
    f = next(f for f in node.fleet.faults if f.kind == "gpu_lost")
    return node.fleet.hosts[f.node], int(node.fleet.gpu_local[f.gpu]), f.onset


def test_gpus_shape_and_catalogue_units():
    node = SimNode("gpu0002", seed=3, scenario="mixed", duration="2h", t0=T0)
    gpus = node.gpus(T0 + 30)
    assert [g["index"] for g in gpus] == list(range(8))
    fields = {m.field for m in catalogue.fields("gpu")}
    for g in gpus:
        assert g["model"] == "NVIDIA H200" and g["uuid"].startswith("GPU-") and g["health"] == "up"
        assert g["pci_bus_id"].startswith("00000000:")
        assert set(g) - {"index", "uuid", "model", "pci_bus_id", "health", "nvlink"} <= fields
        assert "fan_speed_ratio" not in g and "retired_pages_pending" not in g  # H200: NotSupported
        assert isinstance(g["power_watts"], float) and isinstance(g["temperature_gpu_celsius"], int)
        assert len(g["nvlink"]) == 18 and set(g["nvlink"][0]) == {
            "up",
            "crc_flit_errors_total",
            "crc_data_errors_total",
            "replay_errors_total",
            "recovery_errors_total",
            "tx_data_bytes_total",
            "rx_data_bytes_total",
        }
    # same fleet as the file generator: same UUIDs for the same seed and scenario
    again = SimNode("gpu0002", seed=3, scenario="mixed", duration="2h", t0=T0)
    assert [g["uuid"] for g in again.gpus(T0 + 30)] == [g["uuid"] for g in gpus]


def test_time_advances_counters_and_repeats_snapshots():
    node = SimNode("gpu0001", seed=1, scenario="healthy", duration="1h", t0=T0)
    a = node.gpus(T0 + 10)
    assert node.gpus(T0 + 10) == a  # same t: same snapshot
    b = node.gpus(T0 + 130)
    for x, y in zip(a, b, strict=True):
        de = y["energy_joules_total"] - x["energy_joules_total"]
        # energy integrates power over the elapsed 120 s (an idle A100 of the healthy fleet draws 58 W)
        assert 120 * 50 < de < 120 * 710
        assert y["throttle_sw_thermal_ns_total"] == 0


def test_lost_gpu_goes_lost_with_xid79():
    probe = SimNode("gpu0001", seed=2, scenario="memory", duration="1h", t0=T0)
    host, gpu, onset = lost_host(probe)
    node = SimNode(host, seed=2, scenario="memory", duration="1h", t0=T0, speed=10.0)
    before = node.gpus(T0 + max(onset - 30, 1) / 10)
    assert before[gpu]["health"] == "up"
    after = node.gpus(T0 + (onset + 30) / 10)
    assert after[gpu]["health"] == "lost"
    assert [e[2] for e in node.events if e[1] == gpu] == [79]
    assert all(g["health"] == "up" for i, g in enumerate(after) if i != gpu)


def test_agent_collector_reads_a_sim_node():
    pytest.importorskip("pynvml")
    from gpufleet.agent.backends import get_backend
    from gpufleet.agent.collectors.gpu import GpuCollector

    node = SimNode("gpu0003", seed=4, scenario="healthy", duration="1h", t0=T0)
    backend = get_backend("sim", sim_node=node)
    col = GpuCollector(backend, jobs=False)
    samples = col.collect(int((T0 + 60) * 1e9))
    gpu_rows = [s for s in samples if s.measurement == "gpu"]
    assert len(gpu_rows) == 8
    f = gpu_rows[0].fields
    assert f["temperature_slowdown_celsius"] == 89 and f["power_limit_watts"] == 700.0
    links = [s for s in samples if s.measurement == "gpu_nvlink"]
    assert len(links) == 8 * 18


def test_unknown_host_and_from_host(monkeypatch):
    with pytest.raises(GpufleetError, match="not a host"):
        SimNode("nosuch", scenario="healthy")
    monkeypatch.setenv("GPUFLEET_SIM_SCENARIO", "sdc")
    monkeypatch.setenv("GPUFLEET_SIM_SEED", "9")
    node = SimNode.from_host("gpu0012")
    assert node.fleet.n_nodes == 12 and node.fleet.scenario.name == "sdc" and node.fleet.seed == 9
    monkeypatch.setenv("GPUFLEET_SIM_GPUS_PER_NODE", "4")
    monkeypatch.setenv("GPUFLEET_SIM_T0", str(T0))
    node = SimNode.from_host("gpu0002")
    assert node.fleet.gpn == 4 and node.t0 == T0 and len(node.gpus(T0 + 10)) == 4
    monkeypatch.setenv("GPUFLEET_SIM_SEED", "x")
    with pytest.raises(GpufleetError):
        SimNode.from_host("gpu0001")


@pytest.mark.slow
def test_driver_reload_is_stale_then_counters_restart():
    probe = SimNode("gpu0001", seed=5, scenario="chaos", duration="2h", t0=T0)
    node_i, a, b = probe.fleet.driver_reloads[0]
    host = probe.fleet.hosts[node_i]
    node = SimNode(host, seed=5, scenario="chaos", duration="2h", t0=T0, speed=20.0)
    before = node.gpus(T0 + (a - 20) / 20)
    assert all(g["health"] == "up" for g in before)
    during = node.gpus(T0 + (a + b) / 2 / 20)
    assert all(g["health"] == "stale" for g in during)
    after = node.gpus(T0 + (b + 20) / 20)
    assert all(g["health"] == "up" for g in after)
    assert all(
        y["energy_joules_total"] < x["energy_joules_total"] for x, y in zip(before, after, strict=True)
    )


@pytest.mark.slow
def test_time_going_backwards_replays_from_the_start():
    """A probe at wall-clock time (days after the fleet's start) must not spoil the fleet's clock."""
    probe = SimNode("gpu0001", seed=2, scenario="memory", duration="1h", t0=T0)
    host, gpu, onset = lost_host(probe)
    node = SimNode(host, seed=2, scenario="memory", duration="1h", t0=T0)
    assert node.gpus(T0 + 6 * 86400)[gpu]["health"] == "lost"  # far in the future: stepped coarsely
    early = node.gpus(T0 + 10)
    assert early[gpu]["health"] == "up" and node.events == []
    fresh = SimNode(host, seed=2, scenario="memory", duration="1h", t0=T0)
    assert fresh.gpus(T0 + 10) == early  # the same as never having jumped
    assert node.gpus(T0 + onset + 20)[gpu]["health"] == "lost"
