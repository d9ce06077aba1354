# ruff: noqa: E501  (InfluxQL text reads best unbroken; the rest keeps to 110 columns)
"""One GPU: every numeric field of the catalogue's ``gpu`` measurement (grouped by ``GPU_GROUPS``,
counters as rates, the rest in "Other signals"), its NVLink links, canary, events and incidents."""

from __future__ import annotations

from gpufleet.dashboards.assemble import dashboard, fleet_vars, incident_annotation
from gpufleet.dashboards.grafana_units import grafana_unit, rate_unit
from gpufleet.dashboards.influxql import NODE, field, incident_field, metric, tag_matches
from gpufleet.dashboards.panels import dashed_override, hide_time, row, stat, table, target, timeseries

from gpufleet import catalogue

# Panels of the GPU dashboard: (title, fields). Counters are drawn as rates. Any numeric catalogue
# field of the gpu measurement not named here lands in "Other signals", so nothing is left out.
GPU_GROUPS = (
    ("Utilization", ("utilization_gpu_ratio", "utilization_memory_ratio")),
    (
        "Activity (GPM): SM, tensor, DRAM",
        ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio"),
    ),
    (
        "PCIe and NVLink bandwidth (GPM)",
        ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
    ),
    ("Thermal margin (degrees to the nearest slowdown limit)", ("temperature_margin_celsius",)),
    ("Power", ("power_watts", "power_instant_watts", "power_limit_watts")),
    ("Energy (rate = average power)", ("energy_joules_total",)),
    (
        "Temperature vs its thresholds",
        (
            "temperature_gpu_celsius",
            "temperature_memory_celsius",
            "temperature_max_operating_celsius",
            "temperature_slowdown_celsius",
            "temperature_shutdown_celsius",
            "temperature_memory_max_celsius",
        ),
    ),
    ("Clocks", ("clock_sm_mhz", "clock_memory_mhz", "clock_sm_max_mhz")),
    ("Memory", ("memory_used_bytes", "memory_total_bytes")),
    ("Clock events: healthy", ("clock_event_idle", "clock_event_sw_power_cap", "clock_event_sync_boost")),
    (
        "Clock events: faults",
        (
            "clock_event_sw_thermal",
            "clock_event_hw_thermal",
            "clock_event_hw_power_brake",
            "clock_event_hw_slowdown",
        ),
    ),
    (
        "Throttle time (share of time, from the counters)",
        (
            "throttle_sw_power_cap_ns_total",
            "throttle_sw_thermal_ns_total",
            "throttle_hw_thermal_ns_total",
            "throttle_hw_power_brake_ns_total",
        ),
    ),
    ("Clock event reasons (bitmask) and performance state", ("clock_event_reasons", "performance_state")),
    ("PCIe link", ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max")),
    ("PCIe replays", ("pcie_replay_total",)),
    (
        "PCIe link errors (rate)",
        (
            "pcie_l0_to_recovery_total",
            "pcie_correctable_errors_total",
            "pcie_naks_received_total",
            "pcie_receiver_errors_total",
            "pcie_bad_tlp_total",
            "pcie_naks_sent_total",
            "pcie_bad_dllp_total",
            "pcie_nonfatal_errors_total",
            "pcie_fatal_errors_total",
            "pcie_unsupported_requests_total",
            "pcie_lcrc_errors_total",
            "pcie_lane_errors_total",
        ),
    ),
    (
        "Perf-policy time (share of time, from the counters)",
        (
            "perf_policy_thermal_ns_total",
            "perf_policy_sync_boost_ns_total",
            "perf_policy_board_limit_ns_total",
            "perf_policy_low_utilization_ns_total",
            "perf_policy_reliability_ns_total",
            "perf_policy_app_clocks_ns_total",
            "perf_policy_base_clocks_ns_total",
        ),
    ),
    ("ECC errors (volatile, rate)", ("ecc_corrected_volatile_total", "ecc_uncorrected_volatile_total")),
    ("ECC errors (lifetime)", ("ecc_corrected_aggregate_total", "ecc_uncorrected_aggregate_total")),
    (
        "Retired pages and row remaps",
        (
            "retired_pages_sbe",
            "retired_pages_dbe",
            "retired_pages_pending",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        ),
    ),
    ("Health and processes", ("up", "health_code", "process_count", "fan_speed_ratio")),
)
LIFETIME_COUNTERS = {"ecc_corrected_aggregate_total", "ecc_uncorrected_aggregate_total"}
THRESHOLD_FIELDS = {
    "temperature_max_operating_celsius",
    "temperature_slowdown_celsius",
    "temperature_shutdown_celsius",
    "temperature_memory_max_celsius",
    "power_limit_watts",
    "clock_sm_max_mhz",
    "memory_total_bytes",
    "pcie_link_gen_max",
    "pcie_link_width_max",
}


def signal_groups() -> list[tuple[str, tuple[str, ...]]]:
    """``GPU_GROUPS`` with the fields the catalogue has, then "Other signals": every numeric field not named."""
    numeric = [mt.field for mt in catalogue.fields("gpu") if mt.type != "string"]
    named = {x for _, fs in GPU_GROUPS for x in fs}
    groups = [(t, tuple(x for x in fs if ("gpu", x) in catalogue.by_key())) for t, fs in GPU_GROUPS]
    rest = tuple(x for x in numeric if x not in named)
    if rest:
        groups.append(("Other signals", rest))
    return [(t, fs) for t, fs in groups if fs]


def signal_panel(title: str, fields_: tuple[str, ...], where: str) -> dict:
    """One group's time series: counters (but lifetime ones) as rates, threshold fields dashed."""
    metrics = [metric("gpu", x) for x in fields_]
    rates = [mt for mt in metrics if mt.kind == "counter" and mt.field not in LIFETIME_COUNTERS]
    if rates:
        per, divisor, unit = rate_unit(rates[0])
        sel = ", ".join(
            (
                f"non_negative_derivative(last({field('gpu', mt.field)}), {per})"
                + (f" / {divisor}" if divisor != 1 else "")
                + f' AS "{mt.field}"'
            )
            for mt in metrics
        )
        desc = "Counters shown as rates (non_negative_derivative; resets at driver reload are skipped)."
    else:
        units = {grafana_unit(mt) for mt in metrics}
        unit = units.pop() if len(units) == 1 else "short"
        agg = "last" if all(mt.kind == "counter" or mt.tier == "slow" for mt in metrics) else "mean"
        sel = ", ".join(f'{agg}({field("gpu", mt.field)}) AS "{mt.field}"' for mt in metrics)
        desc = "; ".join(f"{mt.field}: {mt.description}" for mt in metrics)
    if title.startswith("Clock event reasons"):
        unit = "none"
    q = f'SELECT {sel} FROM "gpu" WHERE {where} GROUP BY time($__interval) fill(none)'
    dashed = [x for x in fields_ if x in THRESHOLD_FIELDS]
    overrides = [dashed_override("/" + "|".join(dashed) + "/")] if dashed else []
    return timeseries(title, [target(q, alias="$col")], w=8, unit=unit, description=desc, overrides=overrides)


def build() -> dict:
    where = f"$timeFilter AND {NODE} AND {tag_matches('gpu')}"
    panels: list[dict] = [row("Signals (every numeric field of the gpu measurement)")]
    panels += [signal_panel(t, fs, where) for t, fs in signal_groups()]
    panels.append(
        stat(
            "Job",
            [target(f'SELECT last({field("gpu", "job_id")}) AS "job" FROM "gpu" WHERE {where}', alias="job")],
            w=8,
            h=8,
            unit="string",
            description=metric("gpu", "job_id").description,
        )
    )
    nv = "gpu_nvlink"
    panels += [
        row("NVLink"),
        timeseries(
            "NVLink errors per link (rate)",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'non_negative_derivative(last({field(nv, c)}), 1m) AS "{c}"'
                        for c in (
                            "crc_flit_errors_total",
                            "crc_data_errors_total",
                            "replay_errors_total",
                            "recovery_errors_total",
                        )
                    )
                    + f' FROM "{nv}" WHERE {where} GROUP BY time($__interval), "link" fill(none)',
                    alias="link $tag_link $col",
                )
            ],
            w=16,
            h=9,
            unit="cpm",
        ),
        timeseries(
            "NVLink throughput per link",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'non_negative_derivative(last({field(nv, c)}), 1s) AS "{c}"'
                        for c in ("tx_data_bytes_total", "rx_data_bytes_total")
                    )
                    + f' FROM "{nv}" WHERE {where} GROUP BY time($__interval), "link" fill(none)',
                    alias="link $tag_link $col",
                )
            ],
            w=24,
            h=8,
            unit="Bps",
            description="From the per-link data counters (fields 138/139), read with the link rows; a link "
            "far below its siblings carries less of the job's traffic.",
        ),
        table(
            "NVLink links down",
            [
                target(
                    f'SELECT min({field(nv, "up")}) AS "min up", last({field(nv, "up")}) AS "up now" FROM "{nv}" WHERE {where} '
                    f'GROUP BY "link"',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            transformations=[hide_time()],
        ),
        row("Canary, events and incidents"),
        timeseries(
            "Known-answer canary",
            [
                target(
                    f'SELECT last({field("gpu_canary", "passed")}) AS "passed", last({field("gpu_canary", "mismatches")}) '
                    f'AS "mismatches" FROM "gpu_canary" WHERE {where} GROUP BY time($__interval) fill(none)',
                    alias="$col",
                )
            ],
            w=8,
            h=9,
            unit="short",
        ),
        table(
            "XID and ECC events of this GPU",
            [
                target(
                    f'SELECT {field("gpu_event", "code")}, "type", {field("gpu_event", "message")}, {field("gpu_event", "process")}, '
                    f'{field("gpu_event", "pid")} FROM "gpu_event" WHERE {where} ORDER BY time DESC LIMIT 200',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
        ),
        table(
            "Incidents of this GPU",
            [
                target(
                    f"SELECT {incident_field('id')}, {incident_field('kind')}, {incident_field('severity')}, {incident_field('state')}, {incident_field('link')}, {incident_field('summary')} "
                    f'FROM "incident" WHERE $timeFilter AND {tag_matches("host")} AND {incident_field("gpu")} = $gpu ORDER BY time DESC',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
        ),
    ]
    return dashboard(
        "gpu",
        "gpufleet / GPU",
        "Every signal of one GPU, counters as rates, its links, events and incidents.",
        panels,
        fleet_vars(host="single", gpu="single"),
        [incident_annotation(f"{tag_matches('host')} AND {incident_field('gpu')} = $gpu")],
    )
