"""Experiments: grids over k, temperature, proposer, draft and precisions (grid, runner, results), the check
that sampled tokens follow the target (fidelity), and the pair doctor. The app reaches them through
engine.surface; bench.speed.experiment is their command line."""
