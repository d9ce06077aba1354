"""The synthetic fleet: H200-class GPUs with calibrated physics, injected faults and ground truth.

``gpufleet sim`` writes a fleet's telemetry (line protocol in the catalogue's schema), its truth
file and a manifest; ``gpufleet replay`` loads such a directory into InfluxDB;
:class:`gpufleet.sim.node.SimNode` lets the agent's ``sim`` backend play one node of a fleet.
See docs/faults.md and docs/calibration.md.
"""
