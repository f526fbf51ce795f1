"""Workloads: the request list (``requests``), Poisson/agent generation (``generator``), trace replay (``replay``)
and derived length profiles (``profiles``)."""
from dlfp.workload.generator import (  # noqa: F401
    AGENT_QUANTILES_PATH,
    MOONCAKE_BLOCK_TOKENS,
    RequestSpec,
    TOKEN_ID_LOW,
    TraceRequest,
    WorkloadError,
    WorkloadInstance,
    agent_quantile_table,
    common_hash_ids,
    load_trace,
    make_workload,
    nonmatching_rows,
    resolve_trace_path,
    sample_agent_lengths,
    trace_start,
)
