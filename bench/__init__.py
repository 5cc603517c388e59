"""Benchmarks run by `infernix bench ...` (each writes JSON; docs/benchmarks.md holds results)."""
