# ruff: noqa: E501  (InfluxQL text reads best unbroken; the rest keeps to 110 columns)
"""One node: its GPUs side by side (utilization, activity, bandwidth, thermals, power, clocks,
throttling), its NVLink, PCIe, BMC and host."""

from __future__ import annotations

from gpufleet.dashboards.assemble import dashboard, fleet_vars, incident_annotation
from gpufleet.dashboards.grafana_units import grafana_unit
from gpufleet.dashboards.influxql import NODE, field, metric, tag_matches
from gpufleet.dashboards.panels import dashed_override, hide_time, row, table, target, timeseries


def build() -> dict:
    g = "gpu"
    sel = f"$timeFilter AND {NODE} AND {tag_matches('gpu')}"
    per_gpu = 'GROUP BY time($__interval), "gpu" fill(none)'

    def per_gpu_mean(name, agg="mean"):
        return target(f'SELECT {agg}({field(g, name)}) FROM "gpu" WHERE {sel} {per_gpu}', alias="GPU $tag_gpu")

    def thermal_share(fields_, title, desc):
        expr = " + ".join(f"non_negative_derivative(last({field(g, c)}), 1s)" for c in fields_)
        return timeseries(
            title,
            [target(f'SELECT ({expr}) / 1000000000 FROM "gpu" WHERE {sel} {per_gpu}', alias="GPU $tag_gpu")],
            w=8,
            unit="percentunit",
            description=desc,
        )

    nv = "gpu_nvlink"
    nv_total = " + ".join(
        f"spread({field(nv, c)})"
        for c in (
            "crc_flit_errors_total",
            "crc_data_errors_total",
            "replay_errors_total",
            "recovery_errors_total",
        )
    )
    panels = [
        row("GPUs"),
        timeseries(
            "GPU utilization",
            [per_gpu_mean("utilization_gpu_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "utilization_gpu_ratio")),
        ),
        timeseries(
            "SM activity (GPM)",
            [per_gpu_mean("sm_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "sm_active_ratio")),
            description="Share of SMs busy (dcgm-exporter's SM_ACTIVE). At full utilization a GPU waiting "
            "in a collective shows low SM activity; its job's peers stay high.",
        ),
        timeseries(
            "Tensor pipe activity (GPM)",
            [per_gpu_mean("tensor_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "tensor_active_ratio")),
            description=metric(g, "tensor_active_ratio").description,
        ),
        timeseries(
            "DRAM activity (GPM)",
            [per_gpu_mean("dram_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "dram_active_ratio")),
            description=metric(g, "dram_active_ratio").description,
        ),
        timeseries(
            "NVLink bandwidth (GPM, TX + RX)",
            [
                target(
                    f'SELECT mean({field(g, "nvlink_tx_bytes_per_second")}) + mean({field(g, "nvlink_rx_bytes_per_second")}) '
                    f'FROM "gpu" WHERE {sel} {per_gpu}',
                    alias="GPU $tag_gpu",
                )
            ],
            w=8,
            unit="Bps",
        ),
        timeseries(
            "PCIe bandwidth (GPM, TX + RX)",
            [
                target(
                    f'SELECT mean({field(g, "pcie_tx_bytes_per_second")}) + mean({field(g, "pcie_rx_bytes_per_second")}) '
                    f'FROM "gpu" WHERE {sel} {per_gpu}',
                    alias="GPU $tag_gpu",
                )
            ],
            w=8,
            unit="Bps",
        ),
        timeseries(
            "Thermal margin (degrees to slowdown)",
            [per_gpu_mean("temperature_margin_celsius", "min")],
            w=8,
            unit=grafana_unit(metric(g, "temperature_margin_celsius")),
            description=metric(g, "temperature_margin_celsius").description,
        ),
        timeseries(
            "Power vs limit",
            [
                per_gpu_mean("power_watts"),
                target(
                    f'SELECT min({field(g, "power_limit_watts")}) AS "limit" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="power limit",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "power_watts")),
            overrides=[dashed_override("/limit/")],
        ),
        timeseries(
            "GPU temperature vs its thresholds",
            [
                per_gpu_mean("temperature_gpu_celsius", "max"),
                target(
                    f'SELECT min({field(g, "temperature_max_operating_celsius")}) AS "max operating", '
                    f'min({field(g, "temperature_slowdown_celsius")}) AS "slowdown" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="$col",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "temperature_gpu_celsius")),
            description="Dashed lines: the thresholds the GPUs themselves report (lowest across the node).",
            overrides=[dashed_override("/max operating|slowdown/")],
        ),
        timeseries(
            "Memory temperature vs its threshold",
            [
                per_gpu_mean("temperature_memory_celsius", "max"),
                target(
                    f'SELECT min({field(g, "temperature_memory_max_celsius")}) AS "memory max" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="$col",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "temperature_memory_celsius")),
            overrides=[dashed_override("/memory max/")],
        ),
        timeseries(
            "SM clock",
            [
                per_gpu_mean("clock_sm_mhz"),
                target(
                    f'SELECT max({field(g, "clock_sm_max_mhz")}) AS "max" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="max SM clock",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "clock_sm_mhz")),
            overrides=[dashed_override("/max SM clock/", "blue")],
        ),
        timeseries(
            "Memory used",
            [per_gpu_mean("memory_used_bytes", "max")],
            w=8,
            unit=grafana_unit(metric(g, "memory_used_bytes")),
        ),
        thermal_share(
            ("throttle_hw_thermal_ns_total", "throttle_hw_power_brake_ns_total"),
            "Share of time in HW slowdown (thermal or power brake)",
            "Rate of the HW thermal and HW power-brake throttle-time counters: 100% = slowed down the "
            "whole interval. The GPU dashboard shows each reason, SW thermal included.",
        ),
        thermal_share(
            ("throttle_sw_power_cap_ns_total",),
            "Share of time at the power cap (healthy under load)",
            "Rate of the power-cap throttle-time counter; high under full load is normal.",
        ),
        table(
            "Clock-event reasons in range, per GPU",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'mean({field(g, "clock_event_" + r)}) AS "{r}"'
                        for r in (
                            "idle",
                            "sw_power_cap",
                            "sw_thermal",
                            "hw_thermal",
                            "hw_power_brake",
                            "hw_slowdown",
                        )
                    )
                    + f' FROM "gpu" WHERE {sel} GROUP BY "gpu"',
                    fmt="table",
                )
            ],
            w=8,
            unit="percentunit",
            description="Share of the range each reason was active. idle and sw_power_cap are healthy; "
            "thermal, power brake and HW slowdown are not.",
            transformations=[hide_time()],
        ),
        row("NVLink"),
        table(
            "NVLink errors in range (GPU x link)",
            [
                target(
                    f'SELECT {nv_total} AS "errors" FROM "{nv}" WHERE $timeFilter AND {NODE} GROUP BY "gpu", "link"',
                    fmt="table",
                )
            ],
            w=12,
            h=9,
            description="CRC flit + CRC data + replay + recovery errors counted in the range, per link.",
            transformations=[
                {
                    "id": "groupingToMatrix",
                    "options": {"columnField": "link", "rowField": "gpu", "valueField": "errors"},
                }
            ],
            thresholds=[
                {"color": "green", "value": None},
                {"color": "orange", "value": 1},
                {"color": "red", "value": 100},
            ],
            custom={"cellOptions": {"type": "color-background"}, "align": "center"},
        ),
        timeseries(
            "NVLink CRC error rate",
            [
                target(
                    f'SELECT non_negative_derivative(last({field(nv, "crc_flit_errors_total")}), 1m) FROM "{nv}" '
                    f'WHERE $timeFilter AND {NODE} GROUP BY time($__interval), "gpu", "link" fill(none)',
                    alias="GPU $tag_gpu link $tag_link",
                )
            ],
            w=12,
            h=9,
            unit="cpm",
        ),
        row("PCIe"),
        table(
            "PCIe link (current vs max)",
            [
                target(
                    f'SELECT last({field(g, "pcie_link_gen")}) AS "gen", last({field(g, "pcie_link_gen_max")}) AS "gen max", '
                    f'last({field(g, "pcie_link_width")}) AS "width", last({field(g, "pcie_link_width_max")}) AS "width max" '
                    f'FROM "gpu" WHERE {sel} GROUP BY "gpu"',
                    fmt="table",
                )
            ],
            w=12,
            transformations=[hide_time()],
        ),
        timeseries(
            "PCIe replay rate",
            [
                target(
                    f'SELECT non_negative_derivative(last({field(g, "pcie_replay_total")}), 1m) FROM "gpu" WHERE {sel} '
                    f"{per_gpu}",
                    alias="GPU $tag_gpu",
                )
            ],
            w=12,
            unit="cpm",
        ),
        row("BMC"),
        table(
            "BMC sensors (last reading)",
            [
                target(
                    f'SELECT last({field("bmc_sensor", "value")}) AS "value", last({field("bmc_sensor", "state_code")}) AS "state" '
                    f'FROM "bmc_sensor" WHERE $timeFilter AND {NODE} GROUP BY "sensor", "sensor_type", "unit"',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            transformations=[hide_time()],
            description="state: 0 nominal, 1 warning, 2 critical.",
        ),
        timeseries(
            "BMC temperatures",
            [
                target(
                    f'SELECT mean({field("bmc_sensor", "value")}) FROM "bmc_sensor" WHERE $timeFilter AND {NODE} AND '
                    f'"unit" = \'C\' GROUP BY time($__interval), "sensor" fill(none)',
                    alias="$tag_sensor",
                )
            ],
            w=8,
            h=9,
            unit="celsius",
        ),
        timeseries(
            "Node power: BMC vs GPUs",
            [
                target(
                    f'SELECT mean({field("bmc", "power_watts")}) FROM "bmc" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="node (BMC)",
                ),
                target(
                    f'SELECT sum("p") FROM (SELECT mean({field(g, "power_watts")}) AS "p" FROM "gpu" WHERE '
                    f'$timeFilter AND {NODE} GROUP BY time($__interval), "gpu") GROUP BY time($__interval) '
                    f"fill(none)",
                    "B",
                    alias="GPUs",
                ),
            ],
            w=8,
            h=9,
            unit="watt",
        ),
        row("Host"),
        timeseries(
            "CPU utilization",
            [
                target(
                    f'SELECT mean({field("host", "cpu_utilization_ratio")}) FROM "host" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="CPU",
                )
            ],
            w=8,
            unit=grafana_unit(metric("host", "cpu_utilization_ratio")),
        ),
        timeseries(
            "Host memory",
            [
                target(
                    f'SELECT mean({field("host", "memory_used_bytes")}) AS "used", mean({field("host", "memory_total_bytes")}) '
                    f'AS "total" FROM "host" WHERE $timeFilter AND {NODE} GROUP BY time($__interval) fill(none)',
                    alias="$col",
                )
            ],
            w=8,
            unit="bytes",
            overrides=[dashed_override("/total/", "blue")],
        ),
        timeseries(
            "Load average",
            [
                target(
                    f'SELECT mean({field("host", "load1")}) AS "1m", mean({field("host", "load5")}) AS "5m", '
                    f'mean({field("host", "load15")}) AS "15m" FROM "host" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="$col",
                )
            ],
            w=8,
            unit="short",
        ),
    ]
    return dashboard(
        "node",
        "gpufleet / Node",
        "One node: its GPUs side by side, NVLink, PCIe, BMC and host.",
        panels,
        fleet_vars(host="single", gpu="multi"),
        [incident_annotation(NODE)],
    )
