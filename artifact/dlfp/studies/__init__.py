"""Studies beyond the experiment matrix: sensitivity sweep, calibration of the CPU profile, simulator validation,
and the device model against measured GPU operator times."""
