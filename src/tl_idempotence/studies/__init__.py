"""Layer 5 — studies of many reports: training trajectories, cross-model comparisons, sweeps."""
