import pytest

from gpufleet import catalogue


def test_catalogue_loads_and_has_the_required_signals():
    keys = {m.key for m in catalogue.load()}
    for field in ["utilization_gpu_ratio", "power_watts", "power_limit_watts", "energy_joules_total",
                  "temperature_gpu_celsius", "temperature_slowdown_celsius", "clock_event_reasons",
                  "clock_event_hw_thermal", "throttle_hw_thermal_ns_total", "pcie_replay_total",
                  "remapped_rows_pending", "health_code"]:
        assert ("gpu", field) in keys
    assert ("gpu_nvlink", "crc_flit_errors_total") in keys


def test_units_are_ucum_and_names_carry_units():
    suffix = {"W": "_watts", "J": "_joules_total", "Cel": "_celsius", "MHz": "_mhz", "ns": "_ns_total",
              "By": "_bytes", "s": "_seconds"}
    for m in catalogue.load():
        if m.unit in suffix:  # a counter may add _total (tx_data_bytes_total)
            assert m.field.endswith(suffix[m.unit]) or (
                m.kind == "counter" and m.field.endswith(suffix[m.unit] + "_total")), m.field


def test_duplicate_entries_are_rejected():
    entry = dict(measurement="gpu", field="x", otel="a", kind="gauge", unit="1", type="int", tier="fast",
                 source="s", description="d")
    with pytest.raises(catalogue.CatalogueError):
        catalogue.parse({"metric": [entry, entry]})
    with pytest.raises(catalogue.CatalogueError):
        catalogue.parse({"metric": [dict(entry, kind="histogram")]})
