"""The machine: GPUs and devices, models packaged in wheels, optional extras."""
