"""gpufleet analyzer."""
