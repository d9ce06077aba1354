"""Online against batch on simulated fleets in random arrival orders: the property test's method
(tests/test_event_time.py) on fleets and orders it does not use, as a measurement.

    python -m bench.arrival_orders [SCENARIO:NODES:DURATION:SEED ...] [--orders N] [--seed S]

Per fleet: the batch analysis; an all-on-time replay, whose difference from batch is the fleet's
residual; then ``N`` random orders (one host cut off for 3-40 min, its rows landing in one burst
after the cut; two hosts cut at overlapping times; 1-2 % copies a poll or two late; bodies of 200,
1,000 or 5,000 lines). An order is equal to batch where it differs from batch at most where the
on-time replay does (kind, host, GPU, link, start within a poll), drops no row and has no
incident open twice. Prints one line per order that is not, then a table."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.arrival import batch, differ, fault, in_order, lines_of, open_twice, same, within  # noqa: E402 - after the path line

POLL = 30.0
FLEETS = ("chaos:8:60m:31", "chaos:6:90m:33", "mixed:6:60m:33", "thermal:6:60m:32", "memory:6:60m:32",
          "link:6:60m:31", "sdc:6:60m:33", "straggler:6:60m:31", "healthy:4:60m:32")


def _orders(rs: random.Random, hosts: list[bytes], span: int, n: int) -> list:
    out = []
    for k in range(n):
        cuts = {}
        if k % 3 == 0:  # one host, 3-40 min
            cut = rs.randint(180, min(2400, span))
            cuts[rs.choice(hosts)] = (rs.randint(0, max(0, span - 60)), cut, rs.randint(0, 120))
        elif k % 3 == 1:  # two hosts, overlapping
            h1, h2 = rs.sample(hosts, 2)
            c1 = rs.randint(300, min(2400, span))
            s1 = rs.randint(0, max(0, span - c1))
            cuts[h1] = (s1, c1, rs.randint(0, 120))
            cuts[h2] = (rs.randint(s1, s1 + c1 // 2), rs.randint(180, min(2400, span)), rs.randint(0, 120))
        elif rs.random() < 0.5:  # copies, and maybe a cut
            cuts[rs.choice(hosts)] = (rs.randint(0, span), rs.randint(180, 2400), rs.randint(0, 120))
        dup = rs.uniform(0.01, 0.02) if k % 3 == 2 else rs.choice([0.0, rs.uniform(0, 0.02)])
        out.append((cuts, dup, rs.choice([200, 1000, 5000]), rs.randint(0, 2**16)))
    return out


def fleet(spec: str, tmp: Path, n: int, rs: random.Random) -> dict:
    scenario, nodes, duration, seed = spec.split(":")
    out = tmp / spec.replace(":", "-")
    done = subprocess.run([sys.executable, "-m", "gpufleet", "sim", "--nodes", nodes, "--duration", duration,
                           "--step", "10s", "--seed", seed, "--scenario", scenario, "--out", str(out),
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{spec}: gpufleet sim failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    path = out / "telemetry.lp.gz"
    lines = lines_of(path)
    t0 = min(t for t, _h, _l in lines) / 1e9
    span = int(max(t for t, _h, _l in lines) / 1e9 - t0)
    want = batch(path)
    ontime = in_order(lines, t0, ({}, 0.0, 5000, 0), POLL)
    residual = differ(want, ontime.an.incidents(), POLL)
    row = {"fleet": spec, "orders": n, "equal": 0, "start": 0, "kind": 0, "dropped": 0, "twice": 0,
           "residual": sum(len(x) for x in residual)}
    for order in _orders(rs, sorted({h for _t, h, _l in lines}), span, n):
        online = in_order(lines, t0, order, POLL)
        got = online.an.incidents()
        bad_dropped, bad_twice = online.an.dropped_rows > 0, bool(open_twice(got))
        row["dropped"] += bad_dropped
        row["twice"] += bad_twice
        if within(differ(want, got, POLL), residual) and not bad_dropped and not bad_twice:
            row["equal"] += 1
            continue
        # the same faults (kind, host, GPU, link) on both sides: only a start differs
        x, y = same(want, got, POLL)
        faults = sorted(fault(r) for r in x) == sorted(fault(r) for r in y)
        row["start" if faults else "kind"] += 1
        print(f"{spec} order={order!r}: batch only "
              f"{[(r.kind, r.host, r.gpu, round(r.start - t0)) for r in x]}, online only "
              f"{[(r.kind, r.host, r.gpu, round(r.start - t0)) for r in y]}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.arrival_orders", description=__doc__.split("\n\n")[0])
    ap.add_argument("fleets", nargs="*", default=list(FLEETS), help="SCENARIO:NODES:DURATION:SEED")
    ap.add_argument("--orders", type=int, default=4, help="random orders per fleet (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="the orders' random seed (default 0)")
    args = ap.parse_args(argv)
    bad = [f for f in args.fleets if len(f.split(":")) != 4]
    if bad or args.orders < 1:
        ap.error(f"a fleet is SCENARIO:NODES:DURATION:SEED, not {bad[0]!r}" if bad else "--orders: 1 or more")
    rs = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.fleets:
            rows.append(fleet(spec, Path(tmp), args.orders, rs))
    cols = ("fleet", "orders", "equal", "start", "kind", "dropped", "twice", "residual")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
