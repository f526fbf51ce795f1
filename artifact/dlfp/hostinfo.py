"""This host's identity: what decides how fast the real engine's CPU steps run, and a stable key of it.

A real-engine trial (``metadata["hardware"]``, or ``metadata["hardware"]["host"]`` for the emulator and the torch
backend) and a fitted CPU profile (``machine`` in ``hardware/cpu-calibrated.yaml``) carry ``identity``
(``host_identity``) and ``host_key`` (``host_key``). Two recordings may be compared only when they come from one
host: ``same_host_problem`` says why not, in one line naming both hosts. Records written before identities were
kept have neither field; they are an "unknown host", told apart only by their CPU model and logical CPU count.

Identity fields (``None`` where unreadable):

* ``cpu_model`` (``/proc/cpuinfo`` "model name"), ``vector_flags`` (the ``avx2``, ``avx512*`` and ``amx*`` flags,
  sorted, space-separated), ``mhz`` (current frequency of CPU 0, MHz: cpufreq's ``scaling_cur_freq`` or
  ``/proc/cpuinfo`` "cpu MHz"), ``mhz_max`` (cpufreq's ``cpuinfo_max_freq``, MHz);
* ``logical_cpus`` (``os.cpu_count()``), ``affinity`` (``os.sched_getaffinity(0)``, sorted CPU ids);
* ``torch``: ``num_threads``, ``num_interop_threads``, ``cpu_capability`` (ATen's vector ISA path), ``version``
  (``None`` without torch);
* ``env``: the thread settings the engine inherits (``THREAD_ENV`` and every ``KMP_*``), unset ones as ``None``.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

#: vector instruction-set flags recorded (prefixes of /proc/cpuinfo flags)
VECTOR_FLAG_PREFIXES = ("avx512", "avx2", "amx")
#: environment variables of the thread settings recorded in the identity (plus every KMP_* that is set)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
              "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")
#: the identity fields that decide speed, hashed into ``host_key`` (torch's as ``torch.<field>``, the environment's
#: as ``env.<name>``; ``engine_threads``: the real engine's OpenMP threads, ``engine_threads``). The harness
#: process's own torch thread counts and ``OMP_NUM_THREADS`` are recorded, not keyed: vLLM's CPU platform rewrites
#: ``OMP_NUM_THREADS`` from whatever torch the harness imported first, while the engine core binds the threads that
#: ``VLLM_CPU_OMP_THREADS_BIND`` lists (``dlfp.backends.vllm.runner.pin_cpu_threads``)
KEY_FIELDS = ("cpu_model", "vector_flags", "logical_cpus", "affinity_size", "torch.cpu_capability", "engine_threads",
              "env.VLLM_CPU_OMP_THREADS_BIND", "env.OMP_WAIT_POLICY")
#: what an unknown host is called in messages
UNKNOWN = "unknown host (recorded before host identities were kept)"


def _cpuinfo_value(field_name: str, text: str | None = None) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with ``field_name`` (stripped); None when absent."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in text.splitlines():
        if line.startswith(field_name) and ":" in line:
            return line.split(":", 1)[1].strip()
    return None


def vector_flags(flags_line: str | None) -> str:
    """The vector flags (``VECTOR_FLAG_PREFIXES``) of a ``/proc/cpuinfo`` flags line, sorted, space-separated."""
    return " ".join(sorted({x for x in (flags_line or "").split() if x.startswith(VECTOR_FLAG_PREFIXES)}))


def _khz_file_mhz(path: Path) -> float | None:
    """A cpufreq file (kHz) in MHz; None when unreadable."""
    try:
        return int(path.read_text().strip()) / 1000.0
    except (OSError, ValueError):
        return None


def _torch_settings() -> dict[str, Any] | None:
    """torch's thread counts, vector ISA path and version; None when torch is not importable."""
    try:
        import torch
    except Exception:  # not installed, or a broken install raising anything
        return None
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # older torch without it
        capability = None
    return {"num_threads": int(torch.get_num_threads()), "num_interop_threads": int(torch.get_num_interop_threads()),
            "cpu_capability": capability, "version": str(torch.__version__)}


def thread_env(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``THREAD_ENV`` and every ``KMP_*`` variable of ``environ`` (default ``os.environ``); unset ones as None."""
    env = os.environ if environ is None else environ
    out: dict[str, str | None] = {k: env.get(k) for k in THREAD_ENV}
    out.update({k: env[k] for k in sorted(env) if k.startswith("KMP_")})
    return out


def host_identity() -> dict[str, Any]:
    """This process's host identity (see the module docstring for the fields and units); never raises."""
    cpuinfo: str | None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = None
    import platform

    model = _cpuinfo_value("model name", cpuinfo) if cpuinfo else None
    freq = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    mhz = _khz_file_mhz(freq / "scaling_cur_freq")
    if mhz is None and cpuinfo:
        try:
            mhz = float(_cpuinfo_value("cpu MHz", cpuinfo) or "")
        except ValueError:
            mhz = None
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        affinity = None
    return {"cpu_model": model or platform.processor() or None,
            "vector_flags": vector_flags(_cpuinfo_value("flags", cpuinfo) if cpuinfo else None),
            "mhz": mhz, "mhz_max": _khz_file_mhz(freq / "cpuinfo_max_freq"),
            "logical_cpus": os.cpu_count(), "affinity": affinity,
            "torch": _torch_settings(), "env": thread_env()}


def cpu_list_size(text: str | None) -> int | None:
    """The number of CPUs in a list such as ``"1"``, ``"0-3,6"`` (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``); None for an
    unset, ``auto``, ``nobind`` or unparsable value."""
    if not text or text.strip() in ("auto", "nobind"):
        return None
    n = 0
    try:
        for part in text.replace("|", ",").split(","):
            lo, _, hi = part.strip().partition("-")
            first = int(lo)  # a non-number raises ValueError
            n += int(hi) - first + 1 if hi else 1
    except ValueError:
        return None
    return n


def engine_threads(identity: Mapping[str, Any]) -> int | None:
    """The real engine's OpenMP threads: the CPUs ``VLLM_CPU_OMP_THREADS_BIND`` binds when it lists them, else
    ``OMP_NUM_THREADS``, else torch's thread count (None when none is known)."""
    env = identity.get("env") or {}
    n = cpu_list_size(env.get("VLLM_CPU_OMP_THREADS_BIND"))
    if n is not None:
        return n
    try:
        return int(env["OMP_NUM_THREADS"])
    except (KeyError, TypeError, ValueError):
        return (identity.get("torch") or {}).get("num_threads")


def key_fields(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``KEY_FIELDS`` of an identity (``affinity_size``: the number of CPUs in ``affinity``)."""
    torch = identity.get("torch") or {}
    aff = identity.get("affinity")
    vals = {"cpu_model": identity.get("cpu_model"), "vector_flags": identity.get("vector_flags"),
            "logical_cpus": identity.get("logical_cpus"), "affinity_size": len(aff) if aff is not None else None,
            "torch.cpu_capability": torch.get("cpu_capability"), "engine_threads": engine_threads(identity)}
    env = identity.get("env") or {}
    vals.update({f"env.{k}": env.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_WAIT_POLICY")})
    return {k: vals[k] for k in KEY_FIELDS}


def host_key(identity: Mapping[str, Any]) -> str:
    """sha256 (hex) of ``key_fields(identity)`` as sorted-key JSON: equal for hosts that run a step alike."""
    return hashlib.sha256(json.dumps(key_fields(identity), sort_keys=True).encode()).hexdigest()


def identity_record() -> dict[str, Any]:
    """``{"identity": host_identity(), "host_key": ...}``: the fields a host record is extended with."""
    ident = host_identity()
    return {"identity": ident, "host_key": host_key(ident)}


# ------------------------------------------------------------------------------------------ comparing recordings
def host_record(metadata_or_record: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The host record in a trial's metadata (``hardware``, or ``hardware["host"]`` where the trial also names a
    device), or the record itself when given one (a profile's ``machine``); ``{}`` when there is none."""
    rec = metadata_or_record or {}
    if "hardware" in rec:
        rec = rec.get("hardware") or {}
    if isinstance(rec.get("host"), Mapping):
        rec = rec["host"]
    return rec if isinstance(rec, Mapping) else {}


def _legacy(rec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(CPU model, logical CPUs) of a record without an identity (trace ``cpu``/``cpus``; profile ``cpu_model``/
    ``cores``)."""
    model = rec.get("cpu_model", rec.get("cpu"))
    cpus = rec.get("cores", rec.get("cpus"))
    return (str(model) if model else None), (int(cpus) if isinstance(cpus, int) else None)


def host_label(rec: Mapping[str, Any] | None) -> str:
    """One phrase naming a host: CPU model, logical CPUs, threads and the key's first 12 digits; for a record
    without an identity, its CPU model and CPU count and that its host is unknown."""
    rec = rec or {}
    ident = rec.get("identity") if isinstance(rec.get("identity"), Mapping) else (rec if "affinity" in rec else None)
    if ident is None:
        model, cpus = _legacy(rec)
        return f"{model or 'CPU ?'} x{cpus if cpus is not None else '?'}, {UNKNOWN}"
    torch = ident.get("torch") or {}
    key = record_key(rec) or host_key(ident)
    threads = engine_threads(ident)
    return (f"{ident.get('cpu_model') or 'CPU ?'} x{ident.get('logical_cpus')}, {threads if threads else '?'} engine "
            f"threads ({torch.get('cpu_capability') or '?'}), host {key[:12]}")


def record_key(rec: Mapping[str, Any] | None) -> str | None:
    """The host key of a host record: recomputed from its identity (so that records written under an older key
    definition compare under the current one), else its stored ``host_key``; None for a record without either."""
    rec = rec or {}
    ident = rec.get("identity")
    if isinstance(ident, Mapping):
        return host_key(ident)
    return rec.get("host_key")


def same_host_problem(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str | None:
    """Why two host records (``host_record`` of each) are not one host, as a phrase naming both; else None.

    Both with an identity: their keys (``record_key``) differ. Otherwise (a record that predates identities): their CPU
    model or logical CPU count differ where both are known; records that agree on those are not refused (the
    caller says the host is unknown where that matters: ``unknown_host``).
    """
    a, b = a or {}, b or {}
    ka, kb = record_key(a), record_key(b)
    if ka and kb:
        return None if ka == kb else f"{host_label(a)} vs {host_label(b)}"
    (ma, ca), (mb, cb) = _legacy_or_identity(a), _legacy_or_identity(b)
    if (ma and mb and ma != mb) or (ca is not None and cb is not None and ca != cb):
        return f"{host_label(a)} vs {host_label(b)}"
    return None


def _legacy_or_identity(rec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(CPU model, logical CPUs) from the identity where there is one, else from the older fields."""
    ident = rec.get("identity")
    if isinstance(ident, Mapping):
        return ident.get("cpu_model"), ident.get("logical_cpus")
    return _legacy(rec)


def unknown_host(rec: Mapping[str, Any] | None) -> bool:
    """True for a host record without a ``host_key`` (written before identities were kept)."""
    return not (rec or {}).get("host_key")


__all__ = ["KEY_FIELDS", "THREAD_ENV", "UNKNOWN", "VECTOR_FLAG_PREFIXES", "cpu_list_size", "engine_threads",
           "host_identity", "host_key", "host_label", "host_record", "identity_record", "key_fields", "record_key",
           "same_host_problem", "thread_env", "unknown_host", "vector_flags"]
