"""Policy registry: the name an experiment config gives (``policy: dlfps``) -> class and options model.

Adding a policy is one module with its class (a ``PolicyBase`` subclass whose
``config_fields`` name the ``dlfp.config.PolicyConfig`` fields it takes) and
one entry in ``POLICIES``; ``dlfp.config`` validates names and options and
builds policies from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlfp.policies.base import PolicyBase, PolicyOptions
from dlfp.policies.baselines import FixedCap, NoCap
from dlfp.policies.dlfp import DLFP
from dlfp.policies.dlfps.controller import DLFPS
from dlfp.policies.dlfps.options import DLFPSOptions
from dlfp.policies.dlfpg.controller import DLFPG
from dlfp.policies.dlfpg.options import DLFPGOptions


@dataclass(frozen=True)
class PolicyEntry:
    """One registered policy.

    Attributes:
        cls: the policy class; constructed with its ``config_fields`` and the arm's options as keywords.
        options: the pydantic model of the arm's ``options`` mapping (``PolicyOptions``: none allowed).
        slo_options: option name -> field of the experiment's ``slo`` it takes
            when the arm does not set it, e.g. ``{"ttft_slo_s": "ttft_s"}``.
    """

    cls: type[PolicyBase]
    options: type[PolicyOptions] = PolicyOptions
    slo_options: dict[str, str] = field(default_factory=dict)


POLICIES: dict[str, PolicyEntry] = {
    NoCap.name: PolicyEntry(NoCap),
    FixedCap.name: PolicyEntry(FixedCap),
    DLFP.name: PolicyEntry(DLFP),
    DLFPS.name: PolicyEntry(DLFPS, DLFPSOptions, slo_options={"ttft_slo_s": "ttft_s"}),
    DLFPG.name: PolicyEntry(DLFPG, DLFPGOptions, slo_options={"itl_target_s": "itl_s", "ttft_budget_s": "ttft_s"}),
}


def policy_entry(name: str) -> PolicyEntry:
    """The registry entry for policy ``name``.

    Raises:
        ValueError: unknown name (lists the known ones).
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


def policies_taking(config_field: str) -> list[str]:
    """Names of the registered policies whose constructor takes ``config_field`` (e.g. ``"cap"``), sorted."""
    return sorted(n for n, e in POLICIES.items() if config_field in e.cls.config_fields)


__all__ = ["POLICIES", "PolicyEntry", "policies_taking", "policy_entry"]
