"""A real BMC for tests: OpenIPMI's ``ipmi_sim`` on a free loopback UDP port (IPMI 2.0 LAN).

The simulated BMC has temperature (inlet, exhaust), fan, PSU power and status, and voltage
sensors with thresholds, and a SEL. Each analog sensor is polled by the simulator from a file
(raw byte value, once a second): :meth:`IpmiSim.set` writes a new raw value and the BMC reports it
within about a second. SDRs are written in ``sdrcomp``'s format, compiled with
``sdrcomp -8 -r`` and loaded with ``main_sdr_add`` lines.

Use as a context manager; ``stop(kill=True)``/``start()`` take the BMC down and bring it back on
the same port.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.servers import Server

USER, PASSWORD = "admin", "secret"


@dataclass(frozen=True)
class SimSensor:
    num: int
    name: str
    sensor_type: int  # IPMI sensor type (1 temperature, 2 voltage, 4 fan, 8 power supply)
    unit: str  # sdrcomp base_unit
    m: int  # reading = raw * m * 10**r_exp
    r_exp: int
    raw: int  # initial raw value
    thresholds: dict  # sdrcomp name (unc, uc, lnc, lc) -> raw value
    discrete: bool = False


SENSORS = (
    SimSensor(1, "Inlet Temp", 1, "degrees_C", 1, 0, 24, {"unc": 35, "uc": 45}),
    SimSensor(2, "Exhaust Temp", 1, "degrees_C", 1, 0, 41, {"unc": 60, "uc": 70}),
    SimSensor(3, "FAN1", 4, "18", 100, 0, 84, {"lnc": 20, "lc": 10}),  # 18 = RPM
    SimSensor(4, "PSU1 Power", 8, "Watts", 10, 0, 52, {"unc": 150, "uc": 180}),
    SimSensor(5, "12V", 2, "Volts", 1, -1, 121, {"lnc": 114, "lc": 108, "unc": 126, "uc": 132}),
    SimSensor(6, "PSU1 Status", 8, "unspecified", 1, 0, 1, {}, discrete=True),  # bit 0: presence
)

_RETURN = {"unc": "unc", "uc": "uc", "lnc": "lnc", "lc": "lc"}


def _sdr_text(s: SimSensor) -> str:
    lines = ["sdr type 1", "    sensor_owner_id 0x20", "    sensor_owner_lun 0", "    channel_number 0",
             f"    sensor_number {s.num}",
             f"    entity_id {'power_supply' if s.sensor_type == 8 else 'system_board'}",
             "    entity_instance 1", "    init_scanning true", "    init_events true",
             "    init_sensor_type true", "    default_event_gen_on true", "    default_sensor_scan_on true",
             "    sensor_auto_rearm true", f"    sensor_type {s.sensor_type}"]
    if s.discrete:
        lines += ["    event_reading_type_code 0x6f", "    analog_data_format unsigned",
                  "    event0_state_ret true", "    event1_state_ret true"]
    else:
        lines += ["    event_reading_type_code 1", "    init_thresholds true",
                  "    sensor_threshold_access readable", "    sensor_event_msg_ctrl per_state",
                  "    analog_data_format unsigned", "    linearization linear",
                  f"    base_unit {s.unit}", f"    m {s.m}", "    b 0", f"    r_exp {s.r_exp}", "    b_exp 0",
                  "    sensor_maximum 255", "    sensor_minimum 0"]
        for k, v in s.thresholds.items():
            lines += [f"    return_{_RETURN[k]} true", f"    {k}_thrsh_readable true", f"    {k}_thresh {v}"]
    lines += [f'    id_string "{s.name}"', "endsdr", ""]
    return "\n".join(lines)


def _thresh_cmd(s: SimSensor) -> str:
    # sensor_set_threshold mc lun num support enabled(unr uc unc lnr lc lnc) values(5..0)
    order = ("unr", "uc", "unc", "lnr", "lc", "lnc")
    enabled = "".join("1" if k in s.thresholds else "0" for k in order)
    values = " ".join(str(s.thresholds.get(k, 0)) for k in order)
    return f"sensor_set_threshold 0x20 0 {s.num} settable {enabled} {values}"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rmcp_ping(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """ASF presence ping over RMCP; True when the BMC answers with a pong."""
    ping = bytes([0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x80, 0x00, 0x00, 0x00])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(ping, (host, port))
            data, _ = s.recvfrom(512)
        except OSError:
            return False
    return len(data) > 8 and data[8] == 0x40


class IpmiSim(Server):
    """``ipmi_sim`` with a LAN channel on 127.0.0.1:<port>, user admin/secret."""

    name = "ipmi_sim"

    def __init__(self, tmp: Path, sensors=SENSORS, sel_entries: int = 3):
        super().__init__(tmp)
        self.port = _free_udp_port()
        self.host = "127.0.0.1"
        self.user, self.password = USER, PASSWORD
        self.sensors = {s.name: s for s in sensors}
        d = self.tmp
        (d / "state").mkdir(exist_ok=True)
        (d / "lan.conf").write_text(
            "name \"gpufleet-test\"\n"
            "set_working_mc 0x20\n"
            "  startlan 1\n"
            f"    addr 127.0.0.1 {self.port}\n"
            "    priv_limit admin\n"
            "    allowed_auths_callback none md2 md5 straight\n"
            "    allowed_auths_user none md2 md5 straight\n"
            "    allowed_auths_operator none md2 md5 straight\n"
            "    allowed_auths_admin none md2 md5 straight\n"
            "    guid a123456789abcdefa123456789abcdef\n"
            "  endlan\n"
            f"  user 2 true \"{USER}\" \"{PASSWORD}\" admin 10 none md2 md5 straight\n"
        )
        (d / "sdr.sdrs").write_text("".join(_sdr_text(s) for s in sensors))
        subprocess.run(["sdrcomp", "-8", "-r", "-o", str(d / "sdr.rsdr"), str(d / "sdr.sdrs")],
                       check=True, capture_output=True)
        raw = (d / "sdr.rsdr").read_bytes()
        sdr_lines, off = [], 0
        while off + 5 <= len(raw):
            n = 5 + raw[off + 4]
            sdr_lines.append("main_sdr_add 0x20 " + " ".join(f"0x{b:02x}" for b in raw[off:off + n]))
            off += n
        emu = ["mc_setbmc 0x20",
               "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02",
               "sel_enable 0x20 1000 0x0a", *sdr_lines]
        for s in sensors:
            code = "0x6f" if s.discrete else "0x01"
            emu.append(f'sensor_add 0x20 0 {s.num} {s.sensor_type} {code} poll 300 file "{self._val(s)}"')
            if not s.discrete:
                emu.append(_thresh_cmd(s))
                # threshold crossings become SEL entries, as on a real BMC
                bits = "000111111111111"
                emu.append(f"sensor_set_event_support 0x20 0 {s.num} enable scanning per-state "
                           f"{bits} {bits} {bits} {bits}")
            self._val(s).write_text(f"{s.raw}\n")
        for i in range(sel_entries):  # system events already in the log at start
            emu.append(f"sel_add 0x20 0x02 0 0 0 0 0x20 0 4 0x01 0x01 0x01 0x57 {i} 0")
        emu.append("mc_enable 0x20")
        (d / "sim.emu").write_text("\n".join(emu) + "\n")

    def _val(self, s: SimSensor) -> Path:
        return self.tmp / f"s{s.num}.val"

    def set(self, sensor: str, raw: int) -> None:
        """Set a sensor's raw value (the BMC polls the file every 0.3 s)."""
        p = self._val(self.sensors[sensor])
        tmp = p.with_suffix(".tmp")
        tmp.write_text(f"{int(raw)}\n")
        tmp.replace(p)

    def start(self, timeout: float = 30.0):
        """Start (or restart) the BMC with a fresh state directory: the SEL starts as configured."""
        import shutil

        shutil.rmtree(self.tmp / "state", ignore_errors=True)
        (self.tmp / "state").mkdir()
        return super().start(timeout)

    def command(self):
        return ["ipmi_sim", "-c", str(self.tmp / "lan.conf"), "-f", str(self.tmp / "sim.emu"),
                "-s", str(self.tmp / "state"), "-n"]

    def ready(self):
        return rmcp_ping(self.port)

    def lan_args(self) -> dict:
        """Collector kwargs for this BMC."""
        return {"bmc_host": self.host, "bmc_port": self.port, "username": self.user,
                "password": self.password}


if __name__ == "__main__":  # manual check: python -m tests.ipmisim
    import tempfile

    with tempfile.TemporaryDirectory() as t, IpmiSim(Path(t)) as sim:
        t0 = time.perf_counter()
        out = subprocess.run(["ipmitool", "-I", "lanplus", "-C", "3", "-H", sim.host, "-p", str(sim.port),
                              "-U", USER, "-P", PASSWORD, "sdr", "list"], capture_output=True, text=True)
        print(out.stdout, out.stderr, f"{time.perf_counter() - t0:.3f}s")
