"""dlfp: reproducible artifact for Decode-Latency Feedback Prefill (arXiv v1, 2026-09-29).

Data flows one way: config -> workload -> backend (sim | emu | vllm) runs a
Policy -> trace on disk -> metrics/stats -> tables/figures.
"""
__version__ = "0.1.0"
