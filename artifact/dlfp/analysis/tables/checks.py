"""Checks of a whole trace set before anything is rendered from it.

A table is only as good as the set of trials under it, so a render first checks:

* every trial directory loads (readable Parquet, ``dlfp.traces.format.validate``, metadata that matches its place);
* the set is complete: for every backend/experiment present, every arm present (and the baseline arm) has a
  trial for every seed the experiment's config declares (a backend may run a subset of the arms, e.g.
  ``dlfp run <exp> --backend emu --arms baseline dlfp``; a missing seed or a missing baseline is a gap);
* every trial ran the configuration its experiment declares: the recorded config (``metadata["config"]``)
  of a shipped experiment is the one of ``experiments/<experiment>.yaml`` (``dlfp.trial_config.trial_config``: what
  shapes that arm's trial), or its ``--quick`` variant outside the shipped traces root; the trials of a derived
  experiment (``<experiment>+<hash>``, a run with ``--set``) all ran one configuration of that name;
* every pair a table compares (a candidate arm and the baseline arm, same experiment, same seed) ran the same
  workload (``metadata["workload_fingerprint"]``) and the same engine settings (the recorded config without
  ``ENGINE_IGNORED_KEYS``), and, on a real-time backend, on one host (``dlfp.hostinfo``).

``trace_set_problems`` lists every problem as ``(trial directory, message)``; ``PartialTraceSet`` is the
one-line error a strict render raises. ``identical_workload_seeds`` finds seeds that replayed the same
workload, whose paired "interval" would only measure a copy against itself.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlfp.config import ConfigError, ExperimentConfig, experiment_file, load_experiment
from dlfp.paths import PACKAGE_DIR
from dlfp.trial_config import first_difference, trial_config, trial_config_sha256
from dlfp.traces.format import TraceError, trial_dir

if TYPE_CHECKING:  # loading imports this module
    from dlfp.analysis.tables.loading import LoadedTrial, TraceSet

#: Config keys that do not change what an engine runs (documentation, the seed list and the other arms).
ENGINE_IGNORED_KEYS = ("arms", "description", "assumptions", "tags", "seeds")
#: The note of a paired change whose seeds replayed identical workloads.
IDENTICAL_WORKLOADS = "identical workloads: no CI"


class PartialTraceSet(TraceError):
    """A trace set with a corrupt, partial, missing or mismatched trial; the message is one line naming it."""


def engine_settings(config: Any) -> dict:
    """The recorded config (``metadata["config"]``) without ``ENGINE_IGNORED_KEYS``; ``{}`` if none."""
    if not isinstance(config, dict):
        return {}
    return {k: v for k, v in config.items() if k not in ENGINE_IGNORED_KEYS}


def declared_config(experiment: str) -> ExperimentConfig | None:
    """The configuration a shipped experiment declares (``experiments/<experiment>.yaml``); ``None`` for a
    derived id (``<experiment>+<hash>``) or a name no YAML declares."""
    if "+" in experiment:
        return None
    try:
        return load_experiment(experiment)
    except ConfigError:
        return None


def _declared_variants(cfg: ExperimentConfig, arm: str, shipped_root: bool) -> list[ExperimentConfig]:
    """The configurations ``cfg`` allows for a trial of ``arm``: as declared (a ``fixed-<cap>`` arm of
    ``backend_options.frontier_caps`` added), and, outside the shipped traces root, the ``--quick`` variant."""
    from dlfp.pipeline.plan import frontier_overrides, quick_overrides

    if arm not in cfg.arms:
        try:
            cfg = cfg.with_overrides(frontier_overrides(cfg))
        except (ConfigError, TraceError, ValueError):
            pass
    out = [cfg]
    if not shipped_root and quick_overrides(cfg):
        out.append(cfg.with_overrides(quick_overrides(cfg)))
    return out


def config_problem(lt: LoadedTrial, declared: ExperimentConfig | None, reference: LoadedTrial | None,
                   shipped_root: bool = True, variants: dict | None = None) -> str | None:
    """Why trial ``lt`` does not stand for its experiment (one line naming it and the first differing field), else
    ``None``.

    Against ``declared`` (``declared_config``) when the experiment has a YAML (``dlfp.trial_config.trial_config_sha256``
    of the recorded configuration and of the declared one, for the trial's arm, must be equal); otherwise against
    ``reference``, the group's first trial (a derived experiment's trials must all have run the same configuration).
    ``variants``: a dict this call may keep the declared variants of each arm in (for a set of trials).
    """
    recorded = lt.trial.metadata.get("config")
    if not isinstance(recorded, dict):
        return f"{lt.path}: records no configuration (metadata.json has no config); rerun it"
    mine = trial_config(recorded, lt.arm)
    if declared is not None:
        cache = {} if variants is None else variants
        key = (declared.name, lt.arm, shipped_root)
        if key not in cache:
            allowed = _declared_variants(declared, lt.arm, shipped_root)
            cache[key] = (allowed[0], {trial_config_sha256(v, lt.arm) for v in allowed})
        if trial_config_sha256(recorded, lt.arm) in cache[key][1]:
            return None
        diff = first_difference(mine, trial_config(cache[key][0], lt.arm))
        where = experiment_file(lt.experiment)
        where = where.relative_to(PACKAGE_DIR) if where.is_relative_to(PACKAGE_DIR) else where
        return (f"{lt.path}: its configuration is not the one {lt.experiment} declares (first difference "
                f"{diff}, recorded vs {where}); a run with other settings belongs under its own experiment id: "
                f"remove it, or rerun it with `dlfp run {lt.experiment} --backend {lt.backend} --force`")
    if mine.get("name") != lt.experiment:
        return (f"{lt.path}: its configuration names experiment {mine.get('name')!r}, not {lt.experiment!r}; "
                f"remove it or rerun it")
    if reference is None or reference is lt:
        return None
    ref = trial_config(reference.trial.metadata.get("config") or {}, lt.arm)
    ref["arm"] = mine["arm"]  # arms of a derived experiment differ by design; the rest must not
    diff = first_difference(mine, ref)
    if diff is None:
        return None
    return (f"{lt.path}: its configuration differs from that of {reference.path} (first difference {diff}); "
            f"the trials of one experiment id must share one configuration: remove one of them or rerun it")


def config_problems(ts: TraceSet) -> list[tuple[str, str]]:
    """``config_problem`` of every loaded trial, as (path, message)."""
    from dlfp.pipeline.paths import default_traces_dir

    try:
        shipped = ts.root.resolve() == default_traces_dir().resolve()
    except OSError:
        shipped = True
    out, variants = [], {}
    for backend, experiment in ts.groups():
        declared = declared_config(experiment)
        group = ts.select(backend, experiment)
        reference = next((lt for lt in group if isinstance(lt.trial.metadata.get("config"), dict)), None)
        for lt in group:
            msg = config_problem(lt, declared, reference, shipped, variants)
            if msg is not None:
                out.append((str(lt.path), msg))
    return out


def pairing_problem(base: LoadedTrial, cand: LoadedTrial) -> str | None:
    """Why ``cand`` may not be paired with the baseline trial ``base`` (one line naming both), else ``None``."""
    mb, mc = base.trial.metadata, cand.trial.metadata
    fb, fc = mb.get("workload_fingerprint"), mc.get("workload_fingerprint")
    if fb != fc:
        return (f"{cand.path} and {base.path}: different workloads (workload_fingerprint {str(fc)[:12]} vs "
                f"{str(fb)[:12]}); a candidate is only compared with the baseline of the same workload")
    diff = first_difference(engine_settings(mc.get("config")), engine_settings(mb.get("config")))
    if diff is not None:
        return (f"{cand.path} and {base.path}: different engine settings ({diff}); a run with other settings "
                f"belongs under its own experiment id")
    return host_problem(base, cand)


def host_problem(base: LoadedTrial, cand: LoadedTrial) -> str | None:
    """Why two trials of a real-time backend (wall clock: the host sets the speed) recorded on different hosts may
    not be paired (one line naming both hosts and what to run), else ``None``.

    Hosts are told apart by ``dlfp.hostinfo.same_host_problem``: by host key, or for trials that predate host
    identities by CPU model and CPU count. Modelled backends are not checked (their times do not depend on it).
    """
    from dlfp.backends import REGISTRY
    from dlfp.hostinfo import host_record, same_host_problem

    be = REGISTRY.get(cand.backend)
    if be is None or not be.real_time:
        return None
    why = same_host_problem(host_record(cand.trial.metadata), host_record(base.trial.metadata))
    if why is None:
        return None
    return (f"{cand.path} and {base.path}: recorded on different hosts ({why}); a pair compares runs of one host: "
            f"rerun both on this host (`dlfp run {cand.experiment} --backend {cand.backend} --force`)")


def pairing_problems(ts: TraceSet) -> list[tuple[str, str]]:
    """``pairing_problem`` of every candidate trial and the baseline trial of its seed, as (path, message)."""
    out = []
    for backend, experiment in ts.groups():
        base_arm = ts.baseline_arm(backend, experiment)
        base = {lt.seed: lt for lt in ts.select(backend, experiment, base_arm)}
        for lt in ts.select(backend, experiment):
            if lt.arm != base_arm and lt.seed in base:
                msg = pairing_problem(base[lt.seed], lt)
                if msg is not None:
                    out.append((str(lt.path), msg))
    return out


def _group_dirs(ts: TraceSet) -> dict[tuple[str, str], set[str]]:
    """(backend, experiment) -> arms with a trial directory (loaded or not) in the set."""
    groups: dict[tuple[str, str], set[str]] = {}
    for lt in ts.trials:
        groups.setdefault((lt.backend, lt.experiment), set()).add(lt.arm)
    for path, _ in ts.problems:
        backend, experiment, arm = Path(path).parts[-4:-1]
        groups.setdefault((backend, experiment), set()).add(arm)
    return groups


def missing_trials(ts: TraceSet) -> list[tuple[str, str]]:
    """Trials the set lacks: each arm present (and the baseline) x each seed of the config, as (path, message)."""
    have = {(lt.backend, lt.experiment, lt.arm, lt.seed) for lt in ts.trials}
    have |= {(*Path(p).parts[-4:-1], Path(p).name) for p, _ in ts.problems}
    out = []
    for (backend, experiment), arms in sorted(_group_dirs(ts).items()):
        cfg = ts.config(backend, experiment)
        seeds = list(cfg.seeds) if cfg is not None else sorted({lt.seed for lt in ts.select(backend, experiment)})
        for arm in sorted(arms | {ts.baseline_arm(backend, experiment)}):
            for seed in seeds:
                if (backend, experiment, arm, seed) in have or (backend, experiment, arm, f"seed-{seed}") in have:
                    continue
                path = trial_dir(ts.root, backend, experiment, arm, seed)
                out.append((str(path), f"{path}: missing (the config of {experiment} declares seeds "
                                       f"{', '.join(map(str, seeds))} for every arm)"))
    return out


def trace_set_problems(ts: TraceSet) -> list[tuple[str, str]]:
    """Every problem of the set: trials that did not load, missing trials, trials of another configuration
    than their experiment declares, mismatched pairs (path, message)."""
    return list(ts.problems) + config_problems(ts) + missing_trials(ts) + pairing_problems(ts)


def problem_line(path: str, message: str) -> str:
    """A problem as one line that names the trial (the message already does when it starts with the path)."""
    first = message.splitlines()[0] if message else "unusable"
    return first if first.startswith(path) else f"{path}: {first}"


def raise_if_partial(ts: TraceSet, problems: list[tuple[str, str]] | None = None) -> None:
    """Raise ``PartialTraceSet`` naming the first problem (and how many more) when the set has any.

    Raises:
        PartialTraceSet: one line: the first problem, the number of others, and how to render the rest.
    """
    problems = trace_set_problems(ts) if problems is None else problems
    if not problems:
        return
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    raise PartialTraceSet(f"{problem_line(*problems[0])}{more}; nothing was rendered (allow_partial / "
                          f"`dlfp figures --allow-partial` renders the rest into <results>-partial)")


def incomplete_groups(problems: list[tuple[str, str]], root: Path) -> dict[tuple[str, str], str]:
    """(backend, experiment) -> its first problem's line (paths relative to ``root``), for every affected group."""
    out: dict[tuple[str, str], str] = {}
    for path, msg in problems:
        try:
            backend, experiment = Path(path).relative_to(root).parts[:2]
        except ValueError:
            continue
        # relative to the traces root: results never hold machine-specific paths
        out.setdefault((backend, experiment), problem_line(path, msg).replace(str(root) + os.sep, ""))
    return out


def identical_workload_seeds(ts: TraceSet, backend: str, experiment: str) -> list[tuple[int, ...]]:
    """Groups of two or more seeds of one experiment whose trials replayed the same workload fingerprint."""
    by_fp: dict[str, set[int]] = {}
    for lt in ts.select(backend, experiment):
        fp = lt.trial.metadata.get("workload_fingerprint")
        if fp:
            by_fp.setdefault(str(fp), set()).add(lt.seed)
    return sorted(tuple(sorted(s)) for s in by_fp.values() if len(s) > 1)


__all__ = ["ENGINE_IGNORED_KEYS", "IDENTICAL_WORKLOADS", "PartialTraceSet", "config_problem", "config_problems",
           "declared_config", "engine_settings", "host_problem",
           "identical_workload_seeds", "incomplete_groups", "missing_trials", "pairing_problem", "pairing_problems",
           "problem_line", "raise_if_partial", "trace_set_problems"]
