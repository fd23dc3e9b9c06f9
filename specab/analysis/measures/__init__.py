"""Measures: the numbers computed from an Experiment (statistics, spec model, loads, phases, positions, workload,
known truth)."""
