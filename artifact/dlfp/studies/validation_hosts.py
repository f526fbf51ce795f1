"""Which host the audit of ``dlfp validate-sim`` measured: the real-engine traces and the CPU profile, one host.

The real engine's speed is the host's (``dlfp.hostinfo``): real trials of one workload recorded on two hosts are
not compared (``real_host`` refuses them), and a CPU profile fitted on another host than the traces is not
used to simulate them (``profile_host_problem``). Records that predate host identities are an unknown host:
told apart by CPU model and count only, and said so in one line. ``audit_hosts`` and ``host_line`` are what the
audit writes about its hosts (``hosts.json``, and the first line of ``fidelity.md`` when every side is one known
host).
"""
from __future__ import annotations

from typing import Mapping

from dlfp.traces.format import Trial

TrialMap = Mapping[tuple[str, int], Trial]

#: what to run so that the CPU profile and the real-engine traces come from this host (``{exp}``: the workload)
SAME_HOST_COMMAND = "dlfp audit"


def real_host(experiment: str, real: TrialMap, replicates=None) -> Mapping:
    """The host record (``dlfp.hostinfo.host_record``) all real trials of ``experiment`` (and its replicates: one
    map, or one map per replicate run) share.

    Raises:
        ValidationError: two of them were recorded on different hosts (one line naming both and what to run).
    """
    from dlfp.hostinfo import host_record, record_key, same_host_problem
    from dlfp.studies.validation import ValidationError

    items = [(f"{arm}/seed-{seed}", t) for (arm, seed), t in sorted(real.items())]
    from dlfp.studies.validation_audit import replicate_runs

    for n, run in enumerate(replicate_runs(replicates or {}), 1):
        tag = "replicate" if isinstance(replicates, Mapping) else f"replicate {n}"
        items += [(f"{arm}/seed-{seed} ({tag})", t) for (arm, seed), t in sorted(run.items())]
    if not items:
        return {}
    # a trial with an identity is the reference, so that a mix of known and unknown hosts compares against a known one
    ref_name, ref = next(((n, t) for n, t in items if record_key(host_record(t.metadata))), items[0])
    ref_host = host_record(ref.metadata)
    for name, t in items:
        why = same_host_problem(host_record(t.metadata), ref_host)
        if why is not None:
            raise ValidationError(f"{experiment}: real-engine trials {name} and {ref_name} were recorded on different "
                                  f"hosts ({why}); rerun them on one host: `dlfp run {experiment} --backend vllm "
                                  f"--force`")
    return ref_host


def profile_host_problem(experiment: str, gpu_key: str, host: Mapping) -> tuple[str | None, str | None]:
    """``(refusal, note)`` for simulating ``experiment``'s real trials (recorded on ``host``) with ``gpu_key``.

    ``refusal``: one line when ``gpu_key`` is a fitted CPU profile measured on another host than the traces;
    ``note``: one line when either side carries no host identity (then one host is assumed, not checked).
    Both None for a datasheet GPU (nothing was measured) or a checked match.
    """
    from dlfp.devices import roofline as cm
    from dlfp.hostinfo import host_label, same_host_problem, unknown_host

    try:
        spec = cm.load_gpu(gpu_key)
    except Exception:  # an unknown key is reported by the simulator itself, with the known ones
        return None, None
    if spec.kind != "fitted":
        return None, None
    machine = spec.machine or {}
    why = same_host_problem(machine, host)
    if why is not None:
        return (f"{experiment}: the CPU profile {gpu_key!r} was fitted on another host than the real-engine traces "
                f"({why}); measure both on this host: `{SAME_HOST_COMMAND.format(exp=experiment)}`"), None
    if unknown_host(machine) or unknown_host(host):
        lp, lr = host_label(machine), host_label(host)
        where = f"both on {lp}" if lp == lr else f"on {lp} and {lr}"
        return None, (f"{experiment}: CPU profile {gpu_key!r} and real-engine traces {where}: one host is assumed, "
                      "not checked")
    return None, None


def emu_over_profile(emu: TrialMap, gpu_key: str) -> tuple[dict, int]:
    """The emulator trials of ``emu`` whose device is the current fitted profile ``gpu_key`` (their recorded
    ``metadata["hardware"]["gpu"]["fit"]`` equals the profile's), and how many were left out (a trial emulated over
    a profile since refitted describes another device). Every trial is kept for a datasheet GPU."""
    import json

    from dlfp.devices import roofline as cm

    try:
        spec = cm.load_gpu(gpu_key)
    except Exception:  # an unknown key: the simulator refuses it itself
        return dict(emu), 0
    if spec.kind != "fitted":
        return dict(emu), 0
    want = json.dumps(spec.fit, sort_keys=True, default=str)
    kept = {k: t for k, t in emu.items()
            if json.dumps(((t.metadata.get("hardware") or {}).get("gpu") or {}).get("fit"), sort_keys=True,
                          default=str) == want}
    return kept, len(emu) - len(kept)


def audit_hosts(results: Mapping[str, Mapping]) -> dict[str, dict]:
    """Per workload, the hosts of its real-engine traces and of the CPU profile it was simulated with.

    ``results``: ``{experiment: {"host": host record of the real trials, "gpu": the simulated hardware key}}``.
    Returns ``{experiment: {"real": {"label", "host_key", "identity"}, "profile": the same or None}}`` (``None``
    key and identity for a record that predates host identities; ``profile`` None for a datasheet GPU).
    """
    from dlfp.devices import roofline as cm
    from dlfp.hostinfo import host_label, record_key

    def one(rec: Mapping | None) -> dict:
        rec = rec or {}
        return {"label": host_label(rec), "host_key": record_key(rec), "identity": rec.get("identity")}

    out = {}
    for exp, r in results.items():
        prof = None
        try:
            spec = cm.load_gpu(str(r.get("gpu")))
            prof = one(spec.machine) if spec.kind == "fitted" else None
        except Exception:  # an unknown key: the simulator already refused it
            pass
        out[exp] = {"real": one(r.get("host")), "profile": prof}
    return out


def host_line(hosts: Mapping[str, Mapping]) -> str | None:
    """The audit's host sentence: every workload's real engine and CPU profile on one known host; else None."""
    labels = {h["real"]["label"] for h in hosts.values()} | {h["profile"]["label"] for h in hosts.values()
                                                            if h.get("profile")}
    keys = [h["real"]["host_key"] for h in hosts.values()] + [h["profile"]["host_key"] for h in hosts.values()
                                                              if h.get("profile")]
    if not keys or not all(keys) or len(set(keys)) != 1:
        return None
    return f"Real engine and CPU profile measured on one host: {labels.pop()}."


__all__ = ["SAME_HOST_COMMAND", "audit_hosts", "emu_over_profile", "host_line", "profile_host_problem", "real_host"]
