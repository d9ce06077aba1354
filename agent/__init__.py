"""gpufleet agent."""
