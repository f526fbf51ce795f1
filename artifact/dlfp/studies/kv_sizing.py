"""KV-cache size of every GPU experiment, before and after sizing it as vLLM 0.17.1 profiles it.

Writes ``data/results/device/kv_sizing.md`` (``write_kv_sizing``; ``python -m dlfp.studies.kv_sizing``): one row
per distinct engine setting (model, GPU, TP, ``gpu_memory_utilization``, ``max_num_batched_tokens`` including the
sensitivity sweep's values, ``max_num_seqs``, ``block_size``) of the shipped experiments that the simulator and
the emulator size with ``dlfp.devices.specs.kv_cache_blocks`` (datasheet GPUs, not restricted to another
backend), with

* ``tokens_before``: the earlier rule, ``memory * utilisation - weights/tp - 2 GiB`` (``reserve_gib=2.0``);
* ``tokens_after``: ``dlfp.devices.kv_sizing.profile_kv_sizing`` and its terms (GiB per GPU);

and one held-out row: a public vLLM start-up log of Qwen3-8B on one A100-40GB at ``gpu_memory_utilization``
0.85 ("GPU KV cache size: 126,416 tokens"). Nothing in the sizing is fitted to it. Its log gives no batch
settings; the row uses vLLM 0.17.1's online-serving defaults on an A100 (``engine/arg_utils.py``,
``get_batch_defaults``: 2,048 batched tokens, 256 sequences).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlfp.analysis.markdown import atomic_write, to_markdown
from dlfp.config import ConfigError, list_experiments, load_experiment
from dlfp.devices.kv_sizing import profile_kv_sizing
from dlfp.devices.specs import GIB, CostModelError, kv_cache_blocks, load_gpu, load_model
from dlfp.paths import EXPERIMENTS_DIR, REPO_ROOT

RESULT_PATH = Path("data") / "results" / "device" / "kv_sizing.md"
#: Backends whose trials take their KV-cache size from ``kv_cache_blocks``.
SIZED_BACKENDS = ("sim", "emu")
#: The held-out public number (see the module docstring).
PUBLIC_CHECK = {"model": "qwen3-8b", "gpu": "a100-sxm4-40gb", "tp": 1, "gpu_memory_utilization": 0.85,
                "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16, "public_tokens": 126_416}
SETTING = ("model", "gpu", "tp", "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "block_size")


def _sized_by_kv_cache_blocks(cfg) -> bool:
    """A datasheet-GPU experiment that the simulator or emulator may run (tags restrict backends as in
    ``dlfp.pipeline.plan.experiment_backends``)."""
    from dlfp.backends import BACKENDS

    try:
        if load_gpu(cfg.gpu).kind != "datasheet":
            return False
    except CostModelError:
        return False
    only = []
    for t in cfg.tags:
        b = t.split(":", 1)[1] if t.startswith("backend:") else t[: -len("-only")] if t.endswith("-only") else t
        if b in BACKENDS:
            only.append(b)
    return not only or any(b in SIZED_BACKENDS for b in only)


def experiment_settings() -> dict[tuple, list[str]]:
    """Engine setting (``SETTING`` order) -> the shipped experiments that use it, sorted."""
    out: dict[tuple, list[str]] = {}
    for name in list_experiments(EXPERIMENTS_DIR):
        try:
            cfg = load_experiment(EXPERIMENTS_DIR / f"{name}.yaml")
        except ConfigError:
            continue
        if not _sized_by_kv_cache_blocks(cfg) or {"paper-variant", "engine-only"} & set(cfg.tags):  # a variant:
            continue  # its base's engine setting
        budgets = [cfg.max_num_batched_tokens]
        sweep = (cfg.backend_options.get("sensitivity") or {}).get("max_num_batched_tokens") or []
        budgets += [int(b) for b in sweep if int(b) != cfg.max_num_batched_tokens]
        for b in budgets:
            key = (cfg.model, cfg.gpu, cfg.tp, float(cfg.gpu_memory_utilization), int(b), cfg.max_num_seqs,
                   cfg.block_size)
            label = name if b == cfg.max_num_batched_tokens else f"{name} (sensitivity)"
            out.setdefault(key, []).append(label)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _row(setting: dict, experiments: str, public_tokens: int | None) -> dict:
    """One table row: the setting, the terms of the new sizing (GiB), tokens before and after."""
    m, g = load_model(setting["model"]), load_gpu(setting["gpu"])
    kw = {k: setting[k] for k in ("gpu_memory_utilization", "block_size")}
    s = profile_kv_sizing(m, g, setting["tp"], **kw, max_num_batched_tokens=setting["max_num_batched_tokens"],
                          max_num_seqs=setting["max_num_seqs"])
    before = kv_cache_blocks(m, g, setting["tp"], **kw, reserve_gib=2.0) * setting["block_size"]
    row = {k: setting[k] for k in SETTING}
    row.update({"weights_gib": round(s.weight_bytes / GIB, 3),
                "peak_activation_gib": round(s.peak_activation_bytes / GIB, 3),
                "non_torch_gib": round(s.non_torch_bytes / GIB, 3), "kv_gib": round(s.kv_bytes / GIB, 3),
                "tokens_before": before, "tokens_after": s.tokens,
                "change_pct": 100.0 * (s.tokens / before - 1.0),
                "public_tokens": public_tokens,
                "after_vs_public_pct": None if public_tokens is None else 100.0 * (s.tokens / public_tokens - 1.0),
                "before_vs_public_pct": None if public_tokens is None else 100.0 * (before / public_tokens - 1.0),
                "experiments": experiments})
    return row


def kv_sizing_table() -> pd.DataFrame:
    """The rows of ``kv_sizing.md``: every experiment setting, then the held-out public check."""
    rows = [_row(dict(zip(SETTING, key)), ", ".join(names), None) for key, names in experiment_settings().items()]
    check = {k: PUBLIC_CHECK[k] for k in SETTING}
    rows.append(_row(check, "public log (held out)", PUBLIC_CHECK["public_tokens"]))
    df = pd.DataFrame(rows)
    df["public_tokens"] = df["public_tokens"].astype("Int64")
    return df


NOTES = (
    "tokens = KV blocks x block_size per GPU, what vLLM logs as \"GPU KV cache size\".",
    "tokens_before: memory_gib x gpu_memory_utilization - weights/tp - 2 GiB (an assumed reserve), over the bytes "
    "of one token.",
    "tokens_after: vLLM 0.17.1's start-up profiling (gpu_worker.determine_available_memory): ceil(memory x "
    "utilisation) - weights of one TP shard - activation peak of the profile run (forward over "
    "max_num_batched_tokens tokens; sampler over min(max_num_seqs, max_num_batched_tokens) rows) - memory outside "
    "PyTorch's allocator (an assumption: 0.1 GiB, +0.25 GiB of NCCL buffers when tp > 1); CUDA graphs are "
    "captured after the KV cache is sized and are not subtracted. Terms and sources: dlfp/devices/kv_sizing.py.",
    "memory_gib is the nominal memory (dlfp/hardware/gpus.yaml); CUDA reports a little less as total memory.",
    "public_tokens: a public vLLM start-up log of Qwen3-8B on one A100-40GB at gpu_memory_utilization 0.85, held "
    "out (no constant is fitted to it); its batch settings are not logged, vLLM 0.17.1's online-serving defaults "
    "on an A100 are assumed.",
)


def render_kv_sizing(df: pd.DataFrame | None = None) -> str:
    """The Markdown text of ``kv_sizing.md``."""
    df = kv_sizing_table() if df is None else df
    return ("# KV-cache size: before and after sizing as vLLM 0.17.1 profiles it\n\n" + to_markdown(df) + "\n"
            + "".join(f"- {n}\n" for n in NOTES))


def write_kv_sizing(root: str | Path = REPO_ROOT) -> Path:
    """Write ``<root>/data/results/device/kv_sizing.md`` atomically; returns its path."""
    path = Path(root) / RESULT_PATH
    atomic_write(path, render_kv_sizing())
    return path


def main() -> None:
    print(write_kv_sizing())


if __name__ == "__main__":
    main()
