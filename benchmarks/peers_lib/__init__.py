"""Helpers of `benchmarks/peers.py`: peer preparation (prepare), llama.cpp runners and output
parsers (llamacpp), the per-engine workloads (workloads), servers under load (serve) and the
report: tables, plots and the docs section (report)."""
