"""The workbench: workloads, the run matrix against plain decoding, reports and plots, the
backend micro-benchmarks, and the load generator for OpenAI-compatible servers."""
