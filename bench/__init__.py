"""Benchmarks and device proofs: scripts that print figures, run from the repository root
as modules (`python -m bench.bench_train`); bench/README.md lists them."""
