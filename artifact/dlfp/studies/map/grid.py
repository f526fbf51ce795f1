"""The workload map's axes: which paper configuration, and which workload cells, are swept.

A *map* is one paper configuration (a shipped experiment: model, GPU, TP, scheduling, arms) swept over four axes:

* ``prompt_scale``: the factor on the agent profile's prompt lengths, 9 values log-spaced from 0.25 to 4
  (``0.25 * 2 ** (k / 2)``, k = 0..8; 1.0 is the shipped assumption);
* ``rate``: Poisson request rate (requests/s), 5 values spanning the paper's rates (0.05..2 for Qwen3-0.6B, whose
  paper rate is 1.0; 0.05..0.5 for Qwen3-8B and Qwen3-32B, paper rates 0.10 and 0.25);
* ``budget``: the token budget ``max_num_batched_tokens`` (2,048 and 8,192, the artifact's shipped value; for
  Qwen3-0.6B and Qwen3-8B also 16,384, the vLLM ``LLM`` class default on GPUs with at least 70 GiB: the 8B
  anchors of 1.7 s stalls are out of reach of an 8,192-token budget on the simulator);
* ``source``: where the prompt lengths come from (``dlfp.workload.profiles.PROMPT_SOURCES``): the Mooncake
  conversation quantiles (shipped), Mooncake synthetic, Azure LLM 2023 code and conversation.

Each cell runs the experiment's ``baseline`` and ``dlfp`` arms on seeds 801-803 (paired). A *task* is one (cell,
arm, seed): one simulator trial. Its ``key`` is a hash of the base experiment's resolved config, the cell's
overrides, the arm and the seed, so a resumed map recognises finished work and a changed config is never mixed
in.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from dlfp.config import ExperimentConfig, load_experiment
from dlfp.workload.profiles import DEFAULT_PROMPT_SOURCE, PROMPT_SOURCES

#: Prompt-length scales: 9 values, log-spaced 0.25..4 (factor sqrt 2), rounded to 4 decimals.
SCALES: tuple[float, ...] = tuple(round(0.25 * 2 ** (k / 2), 4) for k in range(9))
SOURCES: tuple[str, ...] = tuple(PROMPT_SOURCES)
ARMS: tuple[str, ...] = ("baseline", "dlfp")
SEEDS: tuple[int, ...] = (801, 802, 803)
#: The artifact's shipped assumption for the paper's unstated Agent workload and token budget.
SHIPPED = {"source": DEFAULT_PROMPT_SOURCE, "scale": 1.0, "budget": 8192}
RATES_SMALL = (0.05, 0.125, 0.35, 1.0, 2.0)
RATES_LARGE = (0.05, 0.1, 0.175, 0.25, 0.5)


class MapError(ValueError):
    """A bad map request: unknown configuration, bad axis value, a corrupt or mixed results table."""


@dataclass(frozen=True)
class Cell:
    """One workload point: prompt source, prompt scale, request rate (req/s) and token budget (tokens)."""

    source: str
    scale: float
    rate: float
    budget: int

    def overrides(self) -> dict:
        return {"workload.prompt_source": self.source, "workload.prompt_scale": self.scale,
                "workload.rate": self.rate, "max_num_batched_tokens": self.budget}


@dataclass(frozen=True)
class Task:
    """One simulator trial of the map: ``cell`` x ``arm`` x ``seed``, identified by ``key``."""

    map_name: str
    cell: Cell
    arm: str
    seed: int
    key: str


@dataclass(frozen=True)
class MapSpec:
    """One paper configuration and its axes.

    Attributes:
        name: map name (the configuration); experiment: the shipped experiment it starts from;
        rates, budgets, scales, sources: the axes; paper_rates: the rates the paper ran (marked in figures).
    """

    name: str
    experiment: str
    rates: tuple[float, ...]
    budgets: tuple[int, ...]
    paper_rates: tuple[float, ...]
    scales: tuple[float, ...] = SCALES
    sources: tuple[str, ...] = SOURCES
    arms: tuple[str, ...] = ARMS
    seeds: tuple[int, ...] = SEEDS

    @cached_property
    def base(self) -> ExperimentConfig:
        return load_experiment(self.experiment)

    @cached_property
    def base_digest(self) -> str:
        """sha256 of the base experiment's resolved config (canonical JSON)."""
        dump = json.dumps(self.base.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(dump.encode()).hexdigest()

    def cells(self) -> list[Cell]:
        """Every cell, in axis order (source, budget, scale, rate)."""
        return [Cell(src, sc, r, b) for src in self.sources for b in self.budgets for sc in self.scales
                for r in self.rates]

    def task_key(self, cell: Cell, arm: str, seed: int) -> str:
        payload = json.dumps([self.base_digest, cell.overrides(), arm, int(seed)], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    def tasks(self) -> list[Task]:
        """Every (cell, arm, seed), seeds and arms innermost so a partial map holds complete pairs early."""
        return [Task(self.name, c, a, s, self.task_key(c, a, s)) for c in self.cells() for s in self.seeds
                for a in self.arms]

    def config(self, cell: Cell) -> ExperimentConfig:
        """The base experiment with the cell's overrides (validated).

        Raises:
            dlfp.config.ConfigError: a cell the configuration cannot run.
        """
        return self.base.with_overrides(cell.overrides())


MAPS: dict[str, MapSpec] = {m.name: m for m in (
    MapSpec("qwen3-0.6b-tp1", "qwen3-0.6b-tp1", RATES_SMALL, (2048, 8192, 16384), (1.0,)),
    # TP2 without the 2,048 budget (time): on the TP1 map DLFP's cap hardly binds there (|change| <= 9 %)
    MapSpec("qwen3-0.6b-tp2", "qwen3-0.6b-tp2", RATES_SMALL, (8192, 16384), (1.0,)),
    MapSpec("qwen3-8b", "qwen3-8b-r0.10", RATES_LARGE, (2048, 8192, 16384), (0.1, 0.25)),
    MapSpec("qwen3-32b-tp2", "qwen3-32b-tp2", RATES_LARGE, (2048, 8192), (0.1,)),
    MapSpec("qwen3-32b-tp2-sync", "qwen3-32b-tp2-completion-sync", RATES_LARGE, (2048, 8192), (0.1,)),
)}


def get_map(name: str) -> MapSpec:
    """The map called ``name``.

    Raises:
        MapError: unknown name (lists the known ones).
    """
    if name not in MAPS:
        raise MapError(f"unknown map {name!r}; known: {', '.join(MAPS)}")
    return MAPS[name]


def quick_spec(spec: MapSpec) -> MapSpec:
    """A smoke-test version of ``spec``: 2 scales, 2 rates, 1 budget, 2 sources, 1 seed (8 tasks)."""
    return MapSpec(spec.name, spec.experiment, spec.rates[-2:], spec.budgets[1:2], spec.paper_rates,
                   scales=(0.5, 1.0), sources=SOURCES[:2], seeds=SEEDS[:1])


__all__ = ["ARMS", "Cell", "MAPS", "MapError", "MapSpec", "RATES_LARGE", "RATES_SMALL", "SCALES", "SEEDS", "SHIPPED",
           "SOURCES", "Task", "get_map", "quick_spec"]
