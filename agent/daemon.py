"""``gpufleet agent run``: the node agent's main loop.

Every ``interval`` seconds: run each collector once (timed and isolated: one failing never stops
the others), add the agent's own rows (``gpufleet_collector``, ``gpufleet_agent``), hand them to
the pipeline in one observation pass and collect OpenTelemetry once (exporters: ``file``,
``influx`` and any ``influx.NAME`` destinations, each through its own disk spool and sender,
``otlp``, ``prometheus``: a scrape endpoint serving the last completed tick). systemd:
``READY=1`` after the first successful poll, ``WATCHDOG=1`` after every completed healthy tick,
``STATUS=`` a summary, ``STOPPING=1``.
Degraded (the spool cannot be written: disk full, directory unusable): STATUS says why and the
points are counted as dropped; past ``degraded_restart`` the pings stop, so systemd restarts the
unit (without a watchdog the agent exits 1). Each spool is owned by one agent (a lock taken first
thing: a second agent on the same directory exits 2 at once).
Signals: SIGHUP reloads the config (an invalid one is rejected, the old keeps running;
``RELOADING=1`` + ``MONOTONIC_USEC`` before, ``READY=1`` after either way);
SIGTERM/SIGINT stop, flushing the spool as far as the backend allows within ``flush_timeout``
(5 s), exit 0.
"""

from __future__ import annotations

import inspect
import logging
import signal
import threading
import time
from pathlib import Path

import click
from gpufleet.agent import config as agent_config
from gpufleet.agent.model import Sample

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import influx_options

log = logging.getLogger("gpufleet.agent")


def _make_sim_node(host: str):
    try:
        from gpufleet.sim.node import SimNode
    except ImportError as exc:
        raise ConfigError(f"--sim-node needs the simulator (gpufleet.sim.node): {exc}") from None
    maker = getattr(SimNode, "from_host", None)
    try:
        return maker(host) if maker is not None else SimNode(host)
    except GpufleetError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--sim-node {host!r}: {exc}") from None


def _construct(cls, **available):
    """Build a collector, passing the keyword arguments its constructor accepts."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return cls()
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return cls(**available)
    return cls(**{k: v for k, v in available.items() if k in params})


def _load_collector(name: str, load):
    """A registered collector by name, or a site collector given as ``package.module:Class``."""
    if ":" not in name:
        return load(name)
    import importlib

    mod, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"config key 'agent.collectors': cannot load {name!r}: {exc}") from None


def needs_nvml(names) -> bool:
    """Whether any of the collectors ``names`` reads NVML (its class says ``needs_nvml``): they then
    share one backend. A name that does not load is the constructor's to report."""
    from gpufleet.agent.collectors import load

    for name in names:
        try:
            if getattr(_load_collector(name, load), "needs_nvml", False):
                return True
        except GpufleetError:
            continue
    return False


class Output:
    """One influx destination of a running agent: its spool and the sender draining it."""

    def __init__(self, name: str, spool):
        self.name = name
        self.spool = spool
        self.sender = None

    def row(self, now_ns: int) -> Sample:
        """Its ``gpufleet_agent`` row (tag ``exporter`` = the destination's name)."""
        sp, se = self.spool, self.sender
        f = {"spool_bytes": sp.bytes, "spool_points": sp.points,
             "dropped_points_total": sp.dropped_points + sp.rejected_points,
             "retries_total": se.retries_total, "export_failing_seconds": se.failing_seconds,
             "spool_write_failures_total": sp.write_failures}
        if se.last_latency is not None:
            f["export_latency_seconds"] = se.last_latency
        return Sample("gpufleet_agent", {"exporter": self.name}, f, now_ns)

    def problem(self) -> str:
        sp = self.spool
        if not sp.error:
            return ""
        return f"spool {sp.dir} cannot be written ({sp.error}); {sp.dropped_points} points dropped"

    def summary(self) -> str:
        s = f"{self.name}: spool {self.spool.points} points, {self.spool.bytes} B"
        if self.sender is not None and self.sender.failures:
            s += f", failing ({self.sender.last_error})"
        return s


class Agent:
    """Everything one configuration builds: collectors, pipeline, exporters, spools, senders."""

    backend = None
    _backend_inited = False

    def _part(self, name: str):
        return next((part for cls, part in self.parts if cls.name == name), None)

    @property
    def file(self):
        """The ``file`` exporter's sink, if listed."""
        return self._part("file")

    @property
    def prom(self):
        """The ``prometheus`` exporter, if listed."""
        return self._part("prometheus")

    def __init__(self, cfg: dict):
        from gpufleet.agent.pipeline import Pipeline
        from gpufleet.agent.pipeline.lineprotocol import LineProtocolExporter

        self.cfg = cfg
        a = cfg["agent"]
        self.interval = float(a["interval"])
        self.host = a["host"] or a["sim_node"] or agent_config.hostname(cfg)
        exporters = agent_config.exporters(cfg)
        self.outputs: list[Output] = []  # one per influx destination: its spool and sender
        self.parts: list[tuple[type, object]] = []  # (exporter class, its part), but influx's
        dests = agent_config.influx_destinations(cfg)
        secrets = {d.name: agent_config.influx_secret(d.cfg, d.name) for d in dests}
        self._closed = False
        self.collectors = self._build_collectors(cfg)
        sinks = []
        try:
            for d in dests:
                from gpufleet.agent.pipeline.influx import InfluxSender, SpoolSink
                from gpufleet.agent.spool import Spool

                sp = cfg["spool"]  # its bounds apply to each destination's spool
                spool = Spool(d.spool_dir, sp["max_bytes"], sp["segment_bytes"], sp["fsync"],
                              sp["rejected_max_files"], sp["rejected_max_bytes"])
                out = Output(d.name, spool)
                self.outputs.append(out)
                wake = threading.Event()
                out.sender = InfluxSender(spool, d.cfg, secrets[d.name], wake, name=d.name)
                sinks.append(SpoolSink(spool, d.cfg["batch_lines"], wake, name=d.name))
            # every other listed exporter, built from its section by its class (gpufleet.agent.model)
            classes = agent_config.exporter_classes()
            for name in exporters:
                cls = classes.get(name)
                if cls is None or cls.spooled:  # influx and influx.NAME: the destinations above
                    continue
                part = cls.build(cfg[name], self)
                self.parts.append((cls, part))
                if cls.lines:
                    sinks.append(part)
            precision = dests[0].cfg["precision"] if dests else "ns"  # one for all (agent.config)
            exps = [LineProtocolExporter(sinks, precision=precision)] if sinks else []
            self.lp = exps[0] if exps else None
            exps += [part for cls, part in self.parts if not cls.lines]
            self.pipeline = Pipeline(self.host, cfg["labels"], exps,
                                     identity=any(c.identity for n, c in classes.items() if n in exporters))
            for cls, part in self.parts:
                cls.open_part(part)
        except BaseException:
            self._close_parts()
            raise
        for out in self.outputs:
            out.sender.start()
        unused = sorted(set(agent_config.named_destinations(cfg)) - {d.name.partition(".")[2] for d in dests})
        for name in unused:
            log.warning("[influx.%s] is declared but agent.exporters does not list \"influx.%s\": not used",
                        name, name)
        if agent_config.INFLUX in agent_config.unexported(cfg):
            log.warning("[influx] url is set but agent.exporters does not list \"influx\": nothing is "
                        "sent there (gpufleet agent check refuses this config)")
        self.ticks = 0
        self.ok_ticks = 0
        self.last_summary = ""
        self.stats: dict[str, tuple[float, bool]] = {}
        self._errors_logged: set[str] = set()
        self.timing = {"collect": 0.0, "otel": 0.0, "encode_export": 0.0}  # wall seconds, last tick
        self.cpu_timing = dict(self.timing)  # process CPU seconds, last tick

    def _build_collectors(self, cfg: dict) -> list:
        from gpufleet.agent.collectors import load

        a = cfg["agent"]
        backend = None
        sim_node = None
        needs_backend = needs_nvml(a["collectors"])
        if needs_backend:  # one NVML backend, shared by every collector that reads NVML
            from gpufleet.agent.backends import get_backend

            if a["sim_node"]:
                sim_node = _make_sim_node(a["sim_node"])
            backend = get_backend(a["backend"], sim_node=sim_node)
            try:  # initialised once for all (NVML counts its inits); the gpu collector reports failures
                backend.nvmlInit()
                self._backend_inited = True
            except Exception as exc:  # noqa: BLE001 - no driver: the collectors say so themselves
                log.debug("NVML backend init: %s", exc)
        self.backend = backend
        from gpufleet.agent import status

        out = []
        started = set()
        for name in a["collectors"]:
            if status.unavailable(name, cfg):  # the source is not on this node: not started
                continue
            cls = _load_collector(name, load)
            opts = agent_config.collector_options(cfg, name)
            generic = {"backend": backend, "host": self.host, "hostname": self.host, "config": cfg,
                       "interval": self.interval}
            if opts:  # the collector's own section: its keys win, the config is not passed again
                generic = {k: v for k, v in generic.items() if k not in opts and k != "config"}
            try:
                out.append(_construct(cls, **generic, **opts))
                started.add(name)
            except GpufleetError:
                raise
            except Exception as exc:
                log.error("collector %s could not start: %s; carrying on without it", name, exc)
        gpus, why = (None, "not read by these collectors") if backend is None else status.nvml_gpus(backend)
        for line in status.collector_lines(cfg, gpus, why, started):  # one line each: on, off, unavailable
            log.info("%s", line)
        return out

    # ------------------------------------------------------------------ one tick
    def tick(self, now_ns: int | None = None) -> bool:
        now_ns = time.time_ns() if now_ns is None else now_ns
        begin = getattr(self.backend, "begin_poll", None)
        if begin is not None:  # one snapshot of a simulated/recorded node per tick, for all collectors
            try:
                begin(now_ns)
            except Exception as exc:  # noqa: BLE001 - the gpu collector reports the backend's failures
                log.debug("backend begin_poll: %s", exc)
        samples: list[Sample] = []
        ok_any = not self.collectors
        t_all = time.perf_counter()
        c_all = time.process_time()
        for c in self.collectors:
            name = getattr(c, "name", type(c).__name__)
            t0 = time.perf_counter()
            try:
                got = c.collect(now_ns)
                samples.extend(got or ())
                ok = True
                self._errors_logged.discard(name)
            except Exception as exc:  # isolated: one failing collector never stops the others
                ok = False
                if name not in self._errors_logged:
                    self._errors_logged.add(name)
                    if isinstance(exc, GpufleetError):
                        log.warning("collector %s: %s", name, exc)
                    else:
                        log.warning("collector %s failed: %s: %s", name, type(exc).__name__, exc,
                                    exc_info=log.isEnabledFor(logging.DEBUG))
            dt = time.perf_counter() - t0
            self.stats[name] = (dt, ok)
            ok_any = ok_any or ok
            samples.append(Sample("gpufleet_collector", {"collector": name},
                                  {"duration_seconds": dt, "success": int(ok)}, now_ns))
        t1, c1 = time.perf_counter(), time.process_time()
        samples.extend(self._self_rows(now_ns))
        self.pipeline.observe(samples)
        self.pipeline.collect(now_ns)
        t2, c2 = time.perf_counter(), time.process_time()
        enc = self.lp.encode_seconds if self.lp is not None else 0.0
        enc_cpu = self.lp.encode_cpu_seconds if self.lp is not None else 0.0
        self.timing = {"collect": t1 - t_all, "otel": max(0.0, t2 - t1 - enc), "encode_export": enc}
        # the same split in process CPU time (all threads: the GPU workers count in "collect")
        self.cpu_timing = {"collect": c1 - c_all, "otel": max(0.0, c2 - c1 - enc_cpu),
                           "encode_export": enc_cpu}
        self.ticks += 1
        self.ok_ticks += int(ok_any)
        self.last_points = self.pipeline.points
        return ok_any

    def _self_rows(self, now_ns: int) -> list[Sample]:
        return [out.row(now_ns) for out in self.outputs]

    def problem(self) -> str:
        """Why the agent is degraded ("" when healthy): data it cannot keep (any destination's)."""
        return "; ".join(p for p in (out.problem() for out in self.outputs) if p)

    def summary(self) -> str:
        ok = sum(1 for _, good in self.stats.values() if good)
        pts = getattr(self, "last_points", 0)
        s = f"tick {self.ticks}: {ok}/{len(self.stats)} collectors ok, {pts} points"
        for out in self.outputs:
            s += f"; {out.summary()}"
        return s

    # ------------------------------------------------------------------ shutdown
    def close(self, flush_timeout: float = 5.0) -> bool:
        """Stop: flush the spool as far as the backend allows within ``flush_timeout``."""
        if self._closed:
            return True
        deadline = time.monotonic() + flush_timeout
        for out in self.outputs:  # a spool deleted meanwhile is recreated first, keeping what it can
            out.spool.check()
        for out in self.outputs:  # every destination drains at once, within the one budget
            out.sender.begin_flush(deadline)
        drained = all([out.sender.end_flush() for out in self.outputs])
        for c in self.collectors:
            close = getattr(c, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    log.debug("collector close: %s", exc)
        if self._backend_inited:
            self._backend_inited = False
            try:
                self.backend.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                log.debug("NVML shutdown: %s", exc)
        try:
            self.pipeline.shutdown()
        except Exception as exc:
            log.debug("pipeline shutdown: %s", exc)
        self._close_parts()
        return drained

    def _close_parts(self) -> None:
        self._closed = True
        for out in self.outputs:
            if out.sender is not None:
                out.sender.close()
            out.spool.close()
        for cls, part in self.parts:
            try:
                cls.close_part(part)
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                log.debug("exporter %s close: %s", cls.name, exc)


class Daemon:
    """The loop, signals, reload and systemd notifications around an :class:`Agent`.

    Two clocks, injected for tests: ticks are scheduled on ``clock`` (monotonic seconds), rows
    are stamped with ``wall_ns`` (the wall clock, ns). A step of the wall clock (NTP, an operator)
    moves the stamps, never the schedule: no tick and no watchdog ping is skipped or doubled.
    """

    def __init__(self, load_config, notifier=None, clock=time.monotonic, wall_ns=time.time_ns):
        from gpufleet.agent.notify import Notifier

        self.clock = clock
        self.wall_ns = wall_ns
        self.load_config = load_config
        self.cfg = load_config()
        self.notifier = notifier or Notifier()
        self.wake = threading.Event()
        self.stop_requested = False
        self.reload_requested = False
        self.agent = Agent(self.cfg)
        self.ready_sent = False
        self.degraded_since: float | None = None
        self._restart_logged = False

    def _on_stop(self, signum, frame):
        self.stop_requested = True
        self.wake.set()

    def _on_hup(self, signum, frame):
        self.reload_requested = True
        self.wake.set()

    def reload(self) -> bool:
        """SIGHUP: ``RELOADING=1`` (with ``MONOTONIC_USEC``, as systemd's ``Type=notify-reload``
        protocol asks), the new config, then ``READY=1`` whether it was taken or rejected: the
        unit never stays "reloading"."""
        self.notifier.reloading()
        outcome = "configuration reloaded"
        try:
            try:
                new_cfg = self.load_config()
            except GpufleetError as exc:
                log.error("reload rejected, the running configuration stays: %s", exc)
                outcome = f"reload rejected: {exc}"
                return False
            old_cfg = self.cfg
            self.agent.close(flush_timeout=1.0)
            try:
                self.agent = Agent(new_cfg)
                self.cfg = new_cfg
                _setup_logging(new_cfg["agent"]["log_level"])
                log.info("configuration reloaded")
                return True
            except GpufleetError as exc:
                log.error("reload rejected, the running configuration stays: %s", exc)
                outcome = f"reload rejected: {exc}"
                self.agent = Agent(old_cfg)
                return False
        finally:
            self.notifier.send("READY=1", f"STATUS={outcome}")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        log.info("agent started: host %s, interval %gs, exporters %s%s", self.agent.host, self.agent.interval,
                 ",".join(agent_config.exporters(self.cfg)),
                 "".join(f", {o.name} {o.sender.url_for_logs}" for o in self.agent.outputs))
        next_t = self.clock()  # the schedule: monotonic; the rows: the wall clock (tick's now_ns)
        code = 0
        while not self.stop_requested:
            if self.reload_requested:
                self.reload_requested = False
                self.reload()
                next_t = self.clock()
            now = self.clock()
            if now < next_t:
                self.wake.wait(next_t - now)
                self.wake.clear()
                continue
            ok = self.agent.tick(self.wall_ns())
            if ok and not self.ready_sent:
                self.ready_sent = self.notifier.ready(self.agent.summary()) or True
            if not self._watchdog():
                code = 1
                break
            interval = self.agent.interval
            next_t += interval
            now = self.clock()
            if next_t < now:  # overran: skip the missed ticks, keep the phase
                next_t += ((now - next_t) // interval + 1) * interval
        budget = float(self.cfg["agent"]["flush_timeout"])
        self.notifier.stopping("stopping: flushing the spool")
        t0 = time.monotonic()
        self.agent.close(flush_timeout=max(0.0, budget - 0.3))
        msg = ""
        for out in self.agent.outputs:  # counted from the files, not from what we believe we wrote
            sp = out.spool
            left = sp.points_on_disk()
            msg += f"; {out.name}: {left} points stay in the spool {sp.dir} for the next start" if left else \
                f"; {out.name}: the spool is empty"
            if sp.dropped_points:
                msg += f"; {sp.dropped_points} points were dropped (spool full, unwritable or deleted)"
        log.info("agent stopped in %.1fs%s", time.monotonic() - t0, msg)
        self.notifier.close()
        return code

    def _watchdog(self) -> bool:
        """WATCHDOG=1 and STATUS after a tick; False once degraded past ``degraded_restart``."""
        problem = self.agent.problem()
        if not problem:
            if self.degraded_since is not None:
                log.warning("healthy again")
            self.degraded_since = None
            self._restart_logged = False
            self.notifier.send("WATCHDOG=1", f"STATUS={self.agent.summary()}")
            return True
        now = self.clock()
        if self.degraded_since is None:
            self.degraded_since = now
        limit = float(self.cfg["agent"]["degraded_restart"])
        status = f"STATUS=degraded: {problem}; {self.agent.summary()}"
        if not limit or now - self.degraded_since < limit:
            self.notifier.send("WATCHDOG=1", status)
            return True
        self.notifier.send(status)  # no ping: systemd's watchdog restarts the unit
        if self.notifier.watchdog_s is not None:
            if not self._restart_logged:
                self._restart_logged = True
                log.error("degraded for %.0fs (%s): watchdog pings stopped so systemd restarts the agent",
                          now - self.degraded_since, problem)
            return True
        log.error("degraded for %.0fs (%s): exiting 1 so the service manager restarts the agent",
                  now - self.degraded_since, problem)
        return False


def _setup_logging(level: str) -> None:
    from gpufleet import logs

    logs.setup("%(asctime)s %(levelname)s %(name)s: %(message)s", level)


@click.command("run")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="agent.toml (default: built-in defaults; see docs/agent.md).")
@click.option("--backend", default=None, help="nvml | sim | recorded:PATH")
@click.option("--interval", default=None, help="poll and export interval, e.g. 10s (1s .. 1h)")
@click.option("--exporter", "exporters", multiple=True, help="file | influx | otlp | prometheus (repeatable)")
@influx_options()
@click.option("--spool-dir", default=None)
@click.option("--file-dir", default=None, help="directory of the file exporter")
@click.option("--host", default=None, help="host tag (default: the machine's host name)")
@click.option("--sim-node", default=None, help="play this node of the simulated fleet (with --backend sim)")
@click.option("--label", "labels", multiple=True, help="operator label NAME=VALUE (repeatable)")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]))
def run_command(config_path, backend, interval, exporters, influx, spool_dir, file_dir, host, sim_node,
                labels, log_level):
    """Run the node agent: poll every source each interval and export through OpenTelemetry."""

    def load_config() -> dict:
        cfg = agent_config.load(Path(config_path) if config_path else None)
        cfg = agent_config.apply_overrides(
            cfg, exporters=exporters, labels=labels, influx=influx, backend=backend, interval=interval,
            spool_dir=spool_dir, file_dir=file_dir, host=host, sim_node=sim_node)
        if log_level:
            cfg["agent"]["log_level"] = log_level
        return cfg

    cfg = load_config()
    _setup_logging(cfg["agent"]["log_level"])
    from gpufleet.agent.spool import lock_dir, unlock_dir

    locks = []  # one owner per spool: refuse at once, before the slow start
    try:
        for d in agent_config.influx_destinations(cfg):
            locks.append(lock_dir(d.spool_dir))
        daemon = Daemon(load_config)
    finally:
        for lock in locks:
            unlock_dir(lock)  # the agent's spools hold their own count of the locks now
    code = daemon.run()
    if code:  # click's Exit is swallowed outside standalone mode: a GpufleetError carries the code
        raise GpufleetError("the agent stopped degraded (see the log); the service manager restarts it",
                            exit_code=code)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpufleet.agent.daemon``: the same command outside the ``gpufleet`` group."""
    from gpufleet.cli import main as gpufleet_main

    return gpufleet_main(["agent", "run", *(argv or [])])


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
