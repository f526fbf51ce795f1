"""Per-trial frames the tables are built from: measured tokens, token agreement, guarded iterations.

Each function reads one ``dlfp.traces.format.Trial`` and nothing else; times
are seconds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlfp.traces.format import Trial


def measured_token_ids(trial: Trial) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Measured requests' tokens sorted by (request id, index): ``(request_ids, indices, token_ids)``, (n,) each."""
    ids = trial.measured_requests["request_id"]
    tk = trial.tokens[trial.tokens["request_id"].isin(ids)].sort_values(["request_id", "index"], kind="stable")
    return (tk["request_id"].to_numpy(dtype=object), tk["index"].to_numpy(dtype=np.int64),
            tk["token_id"].to_numpy(dtype=np.int64))


def token_agreement(baseline: Trial, candidate: Trial) -> tuple[int, int]:
    """Exact token-id agreement of two arms on the same seed: ``(agree, compared)``.

    Compared are the measured requests' token positions (request id, index)
    present in either arm (an outer join: a token one arm produced and the
    other did not counts as a disagreement). ``agree`` counts positions with
    identical ids in both.
    """
    def measured(t: Trial) -> pd.DataFrame:
        ids = t.measured_requests["request_id"]
        tk = t.tokens[t.tokens["request_id"].isin(ids)]
        return tk[["request_id", "index", "token_id"]]

    m = measured(baseline).merge(measured(candidate), on=["request_id", "index"], how="outer",
                                 suffixes=("_b", "_c"))
    agree = int((m["token_id_b"] == m["token_id_c"]).fillna(False).sum())
    return agree, int(len(m))


def guarded_iterations(trial: Trial) -> pd.DataFrame:
    """Guarded iterations of a trial with the previous iteration's device time.

    Columns: iteration, schedule_s, prefill_tokens, num_decodes, cap,
    host_interval_s, device_time_s, prev_device_time_s (the device time of
    the iteration scheduled just before, in log order; NaN for the first).
    """
    it = trial.iterations.sort_values("iteration", kind="stable").reset_index(drop=True)
    it = it.assign(prev_device_time_s=it["device_time_s"].shift(1))
    g = it[it["guarded"]]
    return g[["iteration", "schedule_s", "prefill_tokens", "num_decodes", "cap", "host_interval_s",
              "device_time_s", "prev_device_time_s"]].reset_index(drop=True)


__all__ = ["guarded_iterations", "measured_token_ids", "token_agreement"]
