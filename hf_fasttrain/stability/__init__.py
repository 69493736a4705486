"""Stability: the pure cores that keep a run finite and recoverable (clipping, the divergence guard's decision, snapshots, weight averages, precision choice)."""
