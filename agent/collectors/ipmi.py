"""BMC sensors over IPMI: temperatures (inlet/exhaust), fans, PSU power and status, voltages,
DCMI whole-node power and the SEL, through FreeIPMI's command-line tools.

Why FreeIPMI (``ipmi-sensors``, ``ipmi-dcmi``, ``ipmi-sel``): one tool set for in-band
(``/dev/ipmi0``, KCS/SSIF, auto-detected) and out-of-band IPMI 2.0 (lanplus); a stable
comma-separated output with a header-free mode; threshold state as the spec's event bitmask; an
SDR cache so a poll is one sensor-reading round per sensor; session and retransmission timeouts;
one-line error messages (``password invalid``, ``connection timeout``); credentials from a
config file (never on the command line, where ``ps`` would show them). Measured against
``ipmi_sim`` in ``bench/bench_sources.py`` (see docs/sources.md).

Failure handling: every tool run has a hard deadline (the child is killed at ``deadline``), a
failed poll raises (the daemon reports the collector as failed) and starts an exponential
backoff during which ``collect`` fails at once without touching the BMC, so a slow,
unreachable or wrong-password BMC costs the poll loop at most one deadline per backoff step.

Rows: ``bmc_sensor`` (tags sensor, sensor_type, unit; fields value, state_code) per sensor and
one ``bmc`` row (power_watts where DCMI answers; sel_entries, sel_new_entries, sel_last_entry
every ``sel_every`` polls).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from gpufleet.agent.model import Node, Sample, register

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.net import backoff_delay
from gpufleet.options import Option
from gpufleet.secrets import read_secret


class IpmiError(GpufleetError):
    """The BMC did not answer usefully (timeout, authentication, tool error)."""


# Threshold event bitmask (IPMI spec, Get Sensor Reading byte 3): which thresholds are crossed.
_NONCRIT = 0x01 | 0x08  # lower / upper non-critical
_CRIT = 0x02 | 0x04 | 0x10 | 0x20  # lower critical, lower non-recoverable, upper critical, upper n-r
_STATE = {"nominal": 0, "warning": 1, "critical": 2}


def _num(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if v == v else None  # NaN -> absent


def parse_sensors(text: str) -> list[dict]:
    """Parse ``ipmi-sensors --comma-separated-output --output-sensor-state --output-event-bitmask
    --no-header-output`` (columns: id, name, type, state, reading, units, event bitmask).

    Returns dicts with name, type, unit (None when N/A), value (None when N/A) and state_code:
    for threshold sensors (a reading with units) from the bitmask (non-critical -> 1, critical or
    non-recoverable -> 2), else FreeIPMI's interpreted state (Nominal/Warning/Critical).
    Lines that do not have the seven columns are skipped.
    """
    out = []
    for line in text.splitlines():
        cols = line.split(",")
        if len(cols) < 7 or not cols[0].strip().isdigit():
            continue
        # a sensor name may contain commas: the fixed columns are the first one and the last five
        sid, name = cols[0], ",".join(cols[1:-5])
        stype, state, reading, units, bitmask = (c.strip() for c in cols[-5:])
        value = _num(reading)
        unit = units if units and units != "N/A" else None
        code = _STATE.get(state.lower())
        bits = None
        if bitmask.lower().endswith("h"):
            try:
                bits = int(bitmask[:-1], 16)
            except ValueError:
                bits = None
        if value is not None and unit is not None and bits is not None:
            code = 2 if bits & _CRIT else 1 if bits & _NONCRIT else 0
        out.append({"id": int(sid), "name": name.strip(), "type": stype, "unit": unit,
                    "value": value, "state_code": code})
    return out


_DCMI_POWER = re.compile(r"^\s*Current Power\s*:\s*([0-9.]+)\s*Watts", re.M | re.I)
_SEL_COUNT = re.compile(r"^\s*Number of log entries\s*:\s*(\d+)", re.M)


def parse_dcmi_power(text: str) -> float | None:
    """``ipmi-dcmi --get-system-power-statistics`` -> current power in W (None if absent)."""
    m = _DCMI_POWER.search(text)
    if not m:
        return None
    if re.search(r"^\s*Power Measurement\s*:\s*Not Active", text, re.M | re.I):
        return None
    return float(m.group(1))


def parse_sel_info(text: str) -> int | None:
    m = _SEL_COUNT.search(text)
    return int(m.group(1)) if m else None


def parse_sel_entries(text: str) -> list[tuple[int, str]]:
    """``ipmi-sel --comma-separated-output --no-header-output`` -> (record id, 'sensor: event')."""
    out = []
    for line in text.splitlines():
        cols = line.split(",", 5)
        if len(cols) == 6 and cols[0].strip().isdigit():
            out.append((int(cols[0]), f"{cols[3].strip()}: {cols[5].strip()}"))
    return out


LOCAL_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")  # the in-band BMC's device node


def _sensor_type_tag(t: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", t.strip().lower()).strip("_") or "other"


@register("ipmi")
class IpmiCollector:
    """One BMC: the local one (``host`` empty: in-band) or a remote one over IPMI 2.0 LAN."""

    needs_nvml = False
    measurements = ("bmc_sensor", "bmc")
    options = (  # the [ipmi] section
        Option("host", "str", "", "BMC address; empty: the local BMC in-band (/dev/ipmi0)", arg="bmc_host"),
        Option("port", "int", 623, "BMC's IPMI LAN port", 1, 65535, arg="bmc_port"),
        Option("username", "str", "", "BMC user (IPMI LAN)"),
        Option("password", "secret", help="BMC password (IPMI LAN)"),
        Option("privilege", "choice", "", "FreeIPMI privilege level; empty: its default",
               choices=("", "USER", "OPERATOR", "ADMIN")),
        Option("driver", "str", "", "FreeIPMI driver (LAN_2_0, KCS, ...); empty = auto"),
        Option("workarounds", "str", "", "FreeIPMI workaround flags"),
        Option("deadline", "duration", 4.0, "hard limit of one poll: the tool is killed after it", 0.1, 60.0),
        Option("backoff_min", "duration", 10.0, "after a failure, the BMC is left alone this long ...",
               0.01, 86400.0),
        Option("backoff_max", "duration", 300.0, "... doubling up to this", 0.01, 86400.0),
        Option("sel", "bool", True, "read the SEL (entry count, new entries)"),
        Option("sel_every", "int", 6, "read the SEL every this many polls", 1, 100000),
        Option("dcmi", "bool", True, "DCMI power; probed once, again every 100 polls if absent"),
        Option("cache_dir", "path", "", "FreeIPMI's SDR cache; empty: a private temporary folder"),
    )

    @classmethod
    def unavailable(cls, table: dict) -> str | None:
        if table["host"]:  # out of band: the BMC answers (or not) while the agent runs
            return None
        if not any(os.path.exists(d) for d in LOCAL_DEVICES):
            return ("no /dev/ipmi0 (no local BMC, or the ipmi_si/ipmi_devintf modules are not loaded) "
                    "and no [ipmi] host")
        if shutil.which("ipmi-sensors") is None:
            return "FreeIPMI's ipmi-sensors is not installed (apt install freeipmi-tools)"
        return None

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        if table["host"]:
            return "on", f"BMC {table['host']}:{table['port']} over IPMI LAN"
        return "on", "local BMC in-band (/dev/ipmi0, FreeIPMI)"

    @staticmethod
    def check_options(table: dict) -> None:
        """What one key's range cannot say (the agent config calls this)."""
        if table["backoff_min"] > table["backoff_max"]:
            raise ConfigError("config key 'ipmi.backoff_min': is larger than ipmi.backoff_max")

    def __init__(self, bmc_host: str = "", bmc_port: int = 623, username: str = "",
                 password: str | None = None, password_file: str = "", password_env: str = "",
                 privilege: str = "", driver: str = "", workarounds: str = "", deadline: float = 4.0,
                 backoff_min: float = 10.0, backoff_max: float = 300.0, sel: bool = True,
                 sel_every: int = 6, dcmi: bool = True, cache_dir: str = "", clock=time.monotonic):
        host, port = bmc_host, bmc_port
        for tool in ("ipmi-sensors", "ipmi-sel", "ipmi-dcmi"):
            if shutil.which(tool) is None:
                raise ConfigError(f"ipmi: {tool} not found (install freeipmi-tools)")
        if not 0.1 <= float(deadline) <= 60:
            raise ConfigError(f"ipmi.deadline: {deadline} s is outside 0.1..60")
        if backoff_min <= 0 or backoff_max < backoff_min:
            raise ConfigError("ipmi.backoff_min/backoff_max: need 0 < backoff_min <= backoff_max")
        self.host, self.port = host.strip(), int(port)
        self.deadline = float(deadline)
        self.backoff_min, self.backoff_max = float(backoff_min), float(backoff_max)
        self.sel, self.sel_every, self.dcmi = bool(sel), max(1, int(sel_every)), bool(dcmi)
        self._clock = clock
        self._own_dir = tempfile.mkdtemp(prefix="gpufleet-ipmi-")
        weakref.finalize(self, shutil.rmtree, self._own_dir, True)  # also when never closed, or refused
        self.cache_dir = cache_dir or self._own_dir
        secret = read_secret("ipmi.password", password_file, password_env) or password
        self._secret = secret or ""
        conf = Path(self._own_dir) / "freeipmi.conf"
        lines = []
        if self.host:
            if not username:
                raise ConfigError("ipmi.username: needed for a LAN BMC (host is set)")
            lines += [f"driver-type {driver or 'LAN_2_0'}", f"username {username}"]
            if secret:
                lines.append(f"password {secret}")
        elif driver:
            lines.append(f"driver-type {driver}")
        if privilege:
            lines.append(f"privilege-level {privilege}")
        if workarounds:
            lines.append(f"workaround-flags {workarounds}")
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        ms = max(100, int(self.deadline * 1000 * 0.8))
        self._common = [f"--config-file={conf}"]
        if self.host:
            self._common += ["-h", f"{self.host}:{self.port}" if self.port != 623 else self.host,
                             f"--session-timeout={ms}", f"--retransmission-timeout={max(50, ms // 4)}"]
        self.target = f"{self.host}:{self.port}" if self.host else "in-band"
        self._failures = 0
        self._next_try = 0.0
        self._last_error = ""
        self._polls = 0
        self._dcmi_state: bool | None = None if self.dcmi else False  # None: not probed yet
        self._dcmi_probe_at = 0
        self._sel_count: int | None = None
        self._sel_last_id: int | None = None

    # ------------------------------------------------------------------ running the tools
    def _run(self, tool: str, args: list[str], deadline: float) -> str:
        cmd = [tool, *self._common, *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise IpmiError(f"{tool}: BMC {self.target} did not answer within {deadline:.1f} s") from None
        except OSError as exc:
            raise IpmiError(f"{tool}: cannot run: {exc.strerror}") from None
        if p.returncode != 0:
            msg = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
            msg = msg.strip().removeprefix(f"{tool}:").strip()
            raise IpmiError(f"{tool}: BMC {self.target}: {self._redact(msg)}")
        return p.stdout

    def _redact(self, s: str) -> str:
        from gpufleet.net import redact

        return redact(s, [self._secret])

    def _sensors(self, deadline: float) -> str:
        args = ["--comma-separated-output", "--output-sensor-state", "--output-event-bitmask",
                "--no-header-output", "--quiet-cache", f"--sdr-cache-directory={self.cache_dir}"]
        try:
            return self._run("ipmi-sensors", args, deadline)
        except IpmiError as exc:
            if "cache" not in str(exc).lower():
                raise
            # the BMC's SDR changed (firmware update, hot-plug): rebuild the cache once
            return self._run("ipmi-sensors", [*args, "--flush-cache"], deadline)

    # ------------------------------------------------------------------ the collector
    def collect(self, now_ns: int) -> list[Sample]:
        now = self._clock()
        if now < self._next_try:
            raise IpmiError(f"BMC {self.target}: backing off {self._next_try - now:.0f} s after: "
                            f"{self._last_error}")
        t_end = now + self.deadline
        try:
            rows = parse_sensors(self._sensors(self.deadline))
            if not rows:
                raise IpmiError(f"ipmi-sensors: BMC {self.target} listed no sensors")
        except IpmiError as exc:
            self._failures += 1
            delay = backoff_delay(self._failures, self.backoff_min, self.backoff_max, jitter=False)
            self._next_try = self._clock() + delay
            self._last_error = str(exc)
            raise
        self._failures = 0
        self._last_error = ""
        self._polls += 1
        out = []
        for r in rows:
            fields = {}
            if r["value"] is not None:
                fields["value"] = r["value"]
            if r["state_code"] is not None:
                fields["state_code"] = r["state_code"]
            if not fields:
                continue
            tags = {"sensor": r["name"], "sensor_type": _sensor_type_tag(r["type"])}
            if r["unit"]:
                tags["unit"] = r["unit"]
            out.append(Sample("bmc_sensor", tags, fields, now_ns, extra={"sensor_id": r["id"]}))
        bmc: dict[str, object] = {}
        extra: dict[str, object] = {}
        # optional parts share what is left of the deadline; their failure never fails the poll
        if self._dcmi_state is not False or self._polls >= self._dcmi_probe_at:
            left = t_end - self._clock()
            if self.dcmi and left > 0.05:
                try:
                    w = parse_dcmi_power(self._run("ipmi-dcmi", ["--get-system-power-statistics"], left))
                    self._dcmi_state = w is not None
                    if w is not None:
                        bmc["power_watts"] = w
                except IpmiError as exc:
                    self._dcmi_state = False
                    extra["dcmi_error"] = str(exc)
                if not self._dcmi_state:
                    self._dcmi_probe_at = self._polls + 100  # probe again now and then
        if self.sel and (self._polls - 1) % self.sel_every == 0:
            left = t_end - self._clock()
            if left > 0.05:
                try:
                    self._read_sel(bmc, left, t_end)
                except IpmiError as exc:
                    extra["sel_error"] = str(exc)
        if bmc:
            out.append(Sample("bmc", {}, bmc, now_ns, extra=extra))
        return out

    def _read_sel(self, bmc: dict, left: float, t_end: float) -> None:
        count = parse_sel_info(self._run("ipmi-sel", ["--info"], left))
        if count is None:
            return
        bmc["sel_entries"] = count
        prev = self._sel_count
        self._sel_count = count
        if prev is None:  # first look: remember where the log ends, report nothing as new
            left = t_end - self._clock()
            if count and left > 0.05:
                ents = parse_sel_entries(self._run(
                    "ipmi-sel", ["--tail=1", "--comma-separated-output", "--no-header-output",
                                 "--quiet-cache", f"--sdr-cache-directory={self.cache_dir}"], left))
                self._sel_last_id = max((i for i, _ in ents), default=None)
            return
        new = count - prev if count >= prev else count  # a cleared log starts again
        bmc["sel_new_entries"] = new
        left = t_end - self._clock()
        if new and left > 0.05:
            ents = parse_sel_entries(self._run(
                "ipmi-sel", [f"--tail={min(new, 50)}", "--comma-separated-output", "--no-header-output",
                             "--quiet-cache", f"--sdr-cache-directory={self.cache_dir}"], left))
            fresh = [(i, m) for i, m in ents if self._sel_last_id is None or i > self._sel_last_id
                     or count < prev]
            if fresh:
                self._sel_last_id = max(i for i, _ in fresh)
                bmc["sel_last_entry"] = fresh[-1][1][:500]

    def close(self) -> None:
        shutil.rmtree(self._own_dir, ignore_errors=True)
