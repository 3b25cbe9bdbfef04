"""Layer 7 — studies of many reports: training trajectories, cross-model comparisons, sweeps."""
