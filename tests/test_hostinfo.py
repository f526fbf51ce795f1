"""Host identity: the fields recorded, the stable key, telling two hosts apart, and the engine's pinned threads."""
from __future__ import annotations

import hashlib
import json
import os

from dlfp.hostinfo import cpu_list_size, engine_threads, host_identity, host_key, host_label, host_record, key_fields, \
    record_key, same_host_problem, thread_env, unknown_host, vector_flags

#: an identity written out by hand (the fields of ``host_identity``)
INTEL = {"cpu_model": "Intel(R) Xeon(R) Processor", "vector_flags": "amx_bf16 avx2 avx512f", "mhz": 2600.0,
         "mhz_max": None, "logical_cpus": 2, "affinity": [0, 1],
         "torch": {"num_threads": 2, "num_interop_threads": 2, "cpu_capability": "AVX512", "version": "2.10.0"},
         "env": {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_WAIT_POLICY": "PASSIVE",
                 "MKL_NUM_THREADS": None}}


def record(ident: dict) -> dict:
    return {"identity": ident, "host_key": host_key(ident)}


def test_vector_flags_keeps_the_vector_isa_flags_sorted():
    line = "fpu sse avx avx512f avx2 amx_tile avx512_bf16 fma avx_vnni"
    assert vector_flags(line) == "amx_tile avx2 avx512_bf16 avx512f"
    assert vector_flags(None) == ""


def test_host_key_is_the_sha256_of_the_speed_fields_written_out_by_hand():
    text = json.dumps({"affinity_size": 2, "cpu_model": "Intel(R) Xeon(R) Processor", "engine_threads": 1,
                       "env.OMP_WAIT_POLICY": "PASSIVE", "env.VLLM_CPU_OMP_THREADS_BIND": "1", "logical_cpus": 2,
                       "torch.cpu_capability": "AVX512", "vector_flags": "amx_bf16 avx2 avx512f"}, sort_keys=True)
    assert host_key(INTEL) == hashlib.sha256(text.encode()).hexdigest()
    # frequency, the torch version and the other variables do not enter the key; threads and CPUs do
    assert host_key({**INTEL, "mhz": 1200.0, "torch": {**INTEL["torch"], "version": "9"}}) == host_key(INTEL)
    assert host_key({**INTEL, "affinity": [1]}) != host_key(INTEL)
    assert host_key({**INTEL, "env": {**INTEL["env"], "VLLM_CPU_OMP_THREADS_BIND": "0-1"}}) != host_key(INTEL)
    assert host_key({**INTEL, "env": {**INTEL["env"], "OMP_WAIT_POLICY": None}}) != host_key(INTEL)
    assert key_fields(INTEL)["affinity_size"] == 2
    # the harness process's own threads do not decide the engine's (vLLM rewrites OMP_NUM_THREADS from them;
    # the engine core binds the CPUs VLLM_CPU_OMP_THREADS_BIND lists)
    assert host_key({**INTEL, "torch": {**INTEL["torch"], "num_threads": 1}}) == host_key(INTEL)
    assert host_key({**INTEL, "env": {**INTEL["env"], "OMP_NUM_THREADS": "2"}}) == host_key(INTEL)


def test_engine_threads_come_from_the_bound_cpus_then_omp_then_torch():
    assert cpu_list_size("1") == 1 and cpu_list_size("0-3,6") == 5 and cpu_list_size("0-1|4-5") == 4
    assert cpu_list_size("auto") is None and cpu_list_size("nobind") is None and cpu_list_size("x") is None
    assert engine_threads(INTEL) == 1
    no_bind = {**INTEL, "env": {"OMP_NUM_THREADS": "3"}}
    assert engine_threads(no_bind) == 3
    assert engine_threads({**INTEL, "env": {}}) == 2  # torch's own count


def test_a_record_key_is_recomputed_from_its_identity():
    """A record written under an older key definition compares by its identity under the current one."""
    old = {"identity": INTEL, "host_key": "0" * 64}
    assert record_key(old) == host_key(INTEL) and same_host_problem(old, record(INTEL)) is None
    assert record_key({"host_key": "abc"}) == "abc" and record_key({}) is None


def test_this_hosts_identity_has_every_field():
    ident = host_identity()
    assert ident["logical_cpus"] == os.cpu_count()
    assert ident["affinity"] == sorted(os.sched_getaffinity(0))
    assert set(ident) == {"cpu_model", "vector_flags", "mhz", "mhz_max", "logical_cpus", "affinity", "torch", "env"}
    assert ident["torch"] is None or ident["torch"]["num_threads"] >= 1
    assert "OMP_NUM_THREADS" in ident["env"] and "VLLM_CPU_OMP_THREADS_BIND" in ident["env"]
    assert len(host_key(ident)) == 64


def test_thread_env_reports_unset_as_none_and_every_kmp_variable():
    env = thread_env({"OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "1", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "2" and env["MKL_NUM_THREADS"] is None and env["KMP_BLOCKTIME"] == "1"
    assert "PATH" not in env


def test_same_host_problem_names_both_hosts():
    one = record(INTEL)
    fewer_threads = record({**INTEL, "env": {**INTEL["env"], "VLLM_CPU_OMP_THREADS_BIND": "0-1"}})
    assert same_host_problem(one, record(dict(INTEL))) is None
    msg = same_host_problem(one, fewer_threads)
    assert msg is not None and msg.count("Intel(R) Xeon(R) Processor x2") == 2
    assert "1 engine threads" in msg and "2 engine threads" in msg and "\n" not in msg


def test_records_that_predate_identities_are_unknown_and_told_apart_by_cpu_model_and_count():
    legacy_trace = {"cpu": "AMD EPYC", "cpus": 2, "machine": "x86_64"}
    legacy_profile = {"cpu_model": "AMD EPYC", "cores": 2}
    assert unknown_host(legacy_trace) and not unknown_host(record(INTEL))
    assert same_host_problem(legacy_trace, legacy_profile) is None
    assert same_host_problem(legacy_trace, {"cpu": "AMD EPYC", "cpus": 4}) is not None
    msg = same_host_problem(legacy_profile, record(INTEL))
    assert msg is not None and "AMD EPYC x2, unknown host" in msg and "Intel(R) Xeon(R) Processor x2" in msg
    assert host_label(legacy_trace).startswith("AMD EPYC x2, unknown host")


def test_host_record_finds_the_host_in_each_backends_metadata():
    vllm_md = {"hardware": {"cpu": "X", "cpus": 2, **record(INTEL)}}
    emu_md = {"hardware": {"gpu": "a100", "host": {"cpu": "X", **record(INTEL)}}}
    assert host_record(vllm_md)["host_key"] == host_record(emu_md)["host_key"] == host_key(INTEL)
    assert host_record({"cpu_model": "Y"}) == {"cpu_model": "Y"}
    assert host_record(None) == {}


def test_pin_cpu_threads_leaves_the_lowest_cpu_to_the_front_end():
    from dlfp.backends.vllm.runner import pin_cpu_threads

    passive = {"OMP_WAIT_POLICY": "PASSIVE"}
    env: dict = {}
    assert pin_cpu_threads(env, [1, 0]) == {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1", **passive}
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1", **passive}
    env = {}
    assert pin_cpu_threads(env, [7, 0, 5, 2]) == {"VLLM_CPU_OMP_THREADS_BIND": "2,5,7", "OMP_NUM_THREADS": "3",
                                                  **passive}
    env = {}
    assert pin_cpu_threads(env, [3]) == {"VLLM_CPU_OMP_THREADS_BIND": "3", "OMP_NUM_THREADS": "1", **passive}
    # the user's own settings are kept
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-3", "OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "ACTIVE"}
    assert pin_cpu_threads(env, [0, 1]) == {"VLLM_CPU_OMP_THREADS_BIND": "0-3", "OMP_NUM_THREADS": "4",
                                            "OMP_WAIT_POLICY": "ACTIVE"}


def test_machine_description_and_host_hardware_carry_the_same_identity():
    from dlfp.backends.harness import host_hardware
    from dlfp.studies.calibration.profile import machine_description

    m, h = machine_description(), host_hardware()
    assert m["host_key"] == h["host_key"] == host_key(m["identity"])
    assert same_host_problem(m, h) is None
