"""The IPMI collector against a real BMC peer (OpenIPMI's ipmi_sim) and on recorded tool output."""

from __future__ import annotations

import time

import pytest
from gpufleet.agent.collectors.ipmi import (
    IpmiCollector,
    IpmiError,
    parse_dcmi_power,
    parse_sel_entries,
    parse_sel_info,
    parse_sensors,
)

from tests.ipmisim import IpmiSim
from tests.servers import skip_unless

pytestmark = [skip_unless("ipmi_sim"), skip_unless("ipmi-sensors")]

# ipmi-sensors --comma-separated-output --output-sensor-state --output-event-bitmask --no-header-output
# against tests/ipmisim.py with Inlet Temp at 46 C, FAN1 at 1500 RPM and the PSU failure bit set
RECORDED = """\
1,Inlet Temp,Temperature,Critical,46.00,C,0018h
2,Exhaust Temp,Temperature,Nominal,41.00,C,0000h
3,FAN1,Fan,Nominal,1500.00,RPM,0001h
4,PSU1 Power,Power Supply,Nominal,520.00,W,0000h
5,12V,Voltage,Nominal,12.10,V,0000h
6,PSU1 Status,Power Supply,Critical,N/A,N/A,0003h
"""


def test_parse_recorded():
    rows = {r["name"]: r for r in parse_sensors(RECORDED + "garbage line\n7,trunc\n")}
    assert len(rows) == 6
    assert rows["Inlet Temp"] == {"id": 1, "name": "Inlet Temp", "type": "Temperature", "unit": "C",
                                  "value": 46.0, "state_code": 2}
    assert rows["FAN1"]["state_code"] == 1  # lower non-critical: a warning, though FreeIPMI says Nominal
    assert rows["12V"]["value"] == 12.1 and rows["12V"]["state_code"] == 0
    assert rows["PSU1 Status"]["value"] is None and rows["PSU1 Status"]["unit"] is None
    assert rows["PSU1 Status"]["state_code"] == 2
    assert parse_sensors("1,CPU, Die Temp,Temperature,Nominal,50.00,C,0000h")[0]["name"] == "CPU, Die Temp"
    assert parse_dcmi_power("Current Power                        : 412 Watts\n"
                            "Power Measurement                    : Active\n") == 412.0
    assert parse_dcmi_power("Current Power : 0 Watts\nPower Measurement : Not Active\n") is None
    assert parse_dcmi_power("ipmi_cmd_dcmi_get_power_reading: command invalid or unsupported") is None
    assert parse_sel_info("SEL version : 1.5\nNumber of log entries                  : 3\n") == 3
    assert parse_sel_entries("1,PostInit,PostInit,Inlet Temp,Temperature,Upper Non-critical - going high\n"
                             "bad\n") == [(1, "Inlet Temp: Upper Non-critical - going high")]


@pytest.fixture
def bmc(tmp_path):
    with IpmiSim(tmp_path / "bmc") as sim:
        yield sim


def lan(sim, **kw):
    return IpmiCollector(**sim.lan_args(), workarounds="opensesspriv", **kw)


def by_sensor(samples):
    return {s.tags["sensor"]: s for s in samples if s.measurement == "bmc_sensor"}


SEEN: list = []


def wait_for(col, pred, timeout=6.0):
    deadline = time.monotonic() + timeout
    while True:
        samples = col.collect(time.time_ns())
        SEEN.extend(samples)
        if pred(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_live_readings_thresholds_and_sel(bmc):
    col = lan(bmc, sel_every=1)
    try:
        s = wait_for(col, lambda s: by_sensor(s)["Inlet Temp"].fields.get("value") == 24.0)
        rows = by_sensor(s)
        assert rows["Inlet Temp"].tags == {"sensor": "Inlet Temp", "sensor_type": "temperature", "unit": "C"}
        assert rows["Inlet Temp"].fields == {"value": 24.0, "state_code": 0}
        assert rows["Exhaust Temp"].fields["value"] == 41.0
        assert rows["FAN1"].fields["value"] == 8400.0 and rows["FAN1"].tags["unit"] == "RPM"
        assert rows["PSU1 Power"].fields["value"] == 520.0 and rows["PSU1 Power"].tags["unit"] == "W"
        assert rows["12V"].fields["value"] == pytest.approx(12.1)
        assert rows["PSU1 Status"].fields == {"state_code": 0} and "unit" not in rows["PSU1 Status"].tags
        bmc_row = [x for x in s if x.measurement == "bmc"][0]
        assert bmc_row.fields["sel_entries"] == 3
        assert "power_watts" not in bmc_row.fields  # ipmi_sim has no DCMI: absent, never 0

        bmc.set("Inlet Temp", 31)  # a change while the collector runs arrives
        s = wait_for(col, lambda s: by_sensor(s)["Inlet Temp"].fields["value"] == 31.0)
        assert by_sensor(s)["Inlet Temp"].fields == {"value": 31.0, "state_code": 0}

        bmc.set("Inlet Temp", 38)  # above upper non-critical (35)
        s = wait_for(col, lambda s: by_sensor(s)["Inlet Temp"].fields["value"] == 38.0)
        assert by_sensor(s)["Inlet Temp"].fields["state_code"] == 1
        bmc.set("Inlet Temp", 47)  # above upper critical (45)
        bmc.set("FAN1", 15)  # 1500 RPM: below lower non-critical (2000)
        bmc.set("PSU1 Status", 3)  # presence + failure
        s = wait_for(col, lambda s: by_sensor(s)["Inlet Temp"].fields["value"] == 47.0
                     and by_sensor(s)["PSU1 Status"].fields["state_code"] == 2)
        rows = by_sensor(s)
        assert rows["Inlet Temp"].fields["state_code"] == 2
        assert rows["FAN1"].fields == {"value": 1500.0, "state_code": 1}
        assert rows["PSU1 Status"].fields["state_code"] == 2
        # the crossings were logged by the BMC: new SEL entries arrive with their text
        wait_for(col, lambda s: False, timeout=0.5)
        bmc_rows = [x.fields for x in SEEN if x.measurement == "bmc"]
        assert max(r["sel_entries"] for r in bmc_rows) > 3
        assert sum(r.get("sel_new_entries", 0) for r in bmc_rows) >= 2
        texts = [r["sel_last_entry"] for r in bmc_rows if "sel_last_entry" in r]
        assert any(t.startswith("Inlet Temp: Upper Non-critical - going high") for t in texts), texts
        assert any(t.startswith("FAN1: Lower Non-critical - going low") for t in texts), texts
    finally:
        col.close()


def test_wrong_password_fails_fast_and_backs_off(bmc):
    args = {**bmc.lan_args(), "password": "hunter2-wrong"}
    col = IpmiCollector(**args, workarounds="opensesspriv", backoff_min=30)
    try:
        t0 = time.monotonic()
        with pytest.raises(IpmiError) as e:
            col.collect(time.time_ns())
        assert time.monotonic() - t0 < 2.0
        assert "password" in str(e.value) and "hunter2-wrong" not in str(e.value)
        t0 = time.monotonic()
        with pytest.raises(IpmiError, match="backing off"):
            col.collect(time.time_ns())
        assert time.monotonic() - t0 < 0.05  # the BMC is not touched during backoff
    finally:
        col.close()


def test_bmc_down_fails_within_deadline_then_recovers(bmc):
    col = lan(bmc, deadline=1.0, backoff_min=0.3, backoff_max=0.6)
    try:
        assert wait_for(col, lambda s: by_sensor(s)["FAN1"].fields.get("value") == 8400.0)
        bmc.stop(kill=True)
        t0 = time.monotonic()
        with pytest.raises(IpmiError, match="did not answer|timeout"):
            col.collect(time.time_ns())
        assert time.monotonic() - t0 < 1.6  # the deadline holds: the loop is never stalled
        with pytest.raises(IpmiError, match="backing off"):
            col.collect(time.time_ns())
        bmc.start()
        bmc.set("FAN1", 90)
        deadline = time.monotonic() + 8
        got = None
        while time.monotonic() < deadline and got is None:
            time.sleep(0.3)
            try:
                s = col.collect(time.time_ns())
            except IpmiError:
                continue
            if by_sensor(s)["FAN1"].fields.get("value") == 9000.0:
                got = s
        assert got is not None, "collector did not recover after the BMC came back"
    finally:
        col.close()


def test_config_errors(tmp_path):
    from gpufleet.errors import ConfigError

    with pytest.raises(ConfigError, match="username"):
        IpmiCollector(bmc_host="10.0.0.1")
    with pytest.raises(ConfigError, match="password_file"):
        IpmiCollector(bmc_host="10.0.0.1", username="u", password_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="deadline"):
        IpmiCollector(deadline=0)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    col = IpmiCollector(bmc_host="10.0.0.1", username="u", password_file=str(pw))
    try:
        assert "s3cret" not in " ".join(col._common)  # never on a command line
    finally:
        col.close()


def test_inband_without_device_fails_cleanly():
    col = IpmiCollector(deadline=2.0)
    try:
        with pytest.raises(IpmiError, match="in-band"):
            col.collect(time.time_ns())
    finally:
        col.close()


def test_agent_config_section_and_daemon_construction(bmc, monkeypatch):
    from gpufleet.agent import config as agent_config
    from gpufleet.agent.daemon import _construct

    from gpufleet.errors import ConfigError

    monkeypatch.setenv("GPUFLEET_TEST_BMC_PASSWORD", bmc.password)
    cfg = agent_config.validate({"ipmi": {"host": bmc.host, "port": bmc.port, "username": bmc.user,
                                          "password_env": "GPUFLEET_TEST_BMC_PASSWORD",
                                          "workarounds": "opensesspriv", "sel": False}})
    # the daemon passes what the constructor accepts; the node's own host name must not become the BMC
    col = _construct(IpmiCollector, backend=None, host="node-17", hostname="node-17", interval=10.0,
                     **agent_config.collector_options(cfg, "ipmi"))
    try:
        assert col.target == f"{bmc.host}:{bmc.port}"
        rows = wait_for(col, lambda s: "FAN1" in by_sensor(s))
        assert by_sensor(rows)["FAN1"].fields["value"] == 8400.0
    finally:
        col.close()
    with pytest.raises(ConfigError, match="ipmi.passwrd"):
        agent_config.validate({"ipmi": {"passwrd": "x"}})
    with pytest.raises(ConfigError, match="'ipmi.password': a secret is never written in the config"):
        agent_config.validate({"ipmi": {"password": "x"}})
