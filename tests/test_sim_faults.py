"""Fault kinds (``gpufleet.sim.faults.REGISTRY``): each declares its modes and its truth record, and
a new kind is one class: a toy kind registered at test time is read from a scenario and gets its
truth record out of the generator, with no edit anywhere else."""

from __future__ import annotations

import json

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.records import FAULT_KINDS, KINDS
from gpufleet.sim import faults
from gpufleet.sim import scenario as scen
from gpufleet.sim.engine import generate
from gpufleet.sim.fleet import Fault, Fleet


def test_every_registered_kind_is_a_record_kind_with_modes():
    assert faults.REGISTRY, "no fault kind registered"
    for name, kind in faults.REGISTRY.items():
        assert kind.name == name and name in FAULT_KINDS, name  # a kind the analyzer has a detector for
        assert kind.modes and len(set(kind.modes)) == len(kind.modes), name
    # a record kind the simulator has no fault for is not injectable (canary_unchecked is the
    # analyzer's note about its own input of an sdc fault)
    assert set(FAULT_KINDS) - set(faults.REGISTRY) == {"canary_unchecked"}
    # the thermal_throttle fault is scored as the cooling fault it is
    assert faults.REGISTRY["thermal_throttle"].explains_throttling


def test_a_name_registers_once():
    class Again(faults.FaultKind):
        name = "sdc"
        modes = ("canary",)

    with pytest.raises(ValueError, match="registered twice"):
        faults.register(Again)
    assert faults.REGISTRY["sdc"] is faults.Sdc


class Toy(faults.FaultKind):
    """A kind the simulator has never seen: no physics, a record of its own."""

    name = "toy_fault"
    modes = ("quiet", "loud")

    @classmethod
    def truth(cls, f: Fault, seen: faults.Seen) -> faults.Truth:
        return faults.Truth(severity="critical", impact_at=None, detail=f"toy {f.mode} on {f.scope}")


class Plain(faults.FaultKind):
    """A kind that says nothing about its record: the base class's."""

    name = "plain_fault"
    modes = ("one",)


def test_a_new_kind_is_one_class(tmp_path, monkeypatch):
    monkeypatch.setitem(faults.REGISTRY, Toy.name, Toy)
    monkeypatch.setitem(faults.REGISTRY, Plain.name, Plain)
    doc = {"fault": [{"kind": "toy_fault"}, {"kind": "toy_fault", "mode": "loud"},
                     {"kind": "plain_fault", "severity": 1.5, "onset": "5m"}]}
    sc = scen.parse(doc, "toy", "scenario toy")
    assert [(f.kind, f.mode) for f in sc.faults] == [("toy_fault", "quiet"), ("toy_fault", "loud"),
                                                      ("plain_fault", "one")]
    out = tmp_path / "run"
    fleet = Fleet(sc, seed=3, duration=1200.0, step=10.0, nodes=2, gpus_per_node=4)
    manifest = generate(fleet, out, progress=False)
    recs = [json.loads(line) for line in (out / "truth.jsonl").read_text().splitlines()]
    toys = sorted(r["detail"] for r in recs if r["kind"] == "toy_fault")
    assert toys == ["toy loud on gpu", "toy quiet on gpu"]
    assert all(r["severity"] == "critical" and r["impact_at"] is None and r["host"] and r["gpu"] is not None
               for r in recs if r["kind"] == "toy_fault")
    (plain,) = [r for r in recs if r["kind"] == "plain_fault"]
    assert plain["detail"] == "one, severity 1.5" and plain["severity"] == "warning"
    assert plain["start"] == plain["impact_at"] == "2026-11-20T00:05:00Z"
    assert manifest["truth"]["by_kind"] == {"plain_fault": 1, "toy_fault": 2}
    # once unregistered, the kind is an unknown kind again
    monkeypatch.delitem(faults.REGISTRY, Toy.name)
    with pytest.raises(GpufleetError, match="unknown kind 'toy_fault'"):
        scen.parse(doc, "toy", "scenario toy")


def test_a_record_kind_with_no_fault_is_a_clear_error(tmp_path, capsys):
    from gpufleet.cli import main

    f = tmp_path / "s.toml"
    f.write_text('[[fault]]\nkind = "canary_unchecked"\n')
    assert main(["sim", "--scenario", str(f), "--out", str(tmp_path / "o"), "--duration", "10m"]) == 2
    err = capsys.readouterr().err
    assert "unknown kind 'canary_unchecked'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    assert "canary_unchecked" in KINDS
