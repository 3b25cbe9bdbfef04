"""Issue 47: ``rep.mechanism(model=model, progress=False)`` on SmolLM2-135M with its defaults: the summary's
within-layer and unstratified Spearman p, the matched-control comparison, the base rates, the projection facts, the
bootstrap and the copy-suppression split, the headline, CPU and wall seconds; then a save and a load (the loader
recomputes every field). Results: benchmarks/RESULTS.md. Run: ``/usr/bin/time -v python
benchmarks/check_mechanism_controls.py`` (about 10 CPU-minutes on a loaded 2-core machine)."""

from __future__ import annotations

import json
import tempfile
import time

import tl_idempotence as tli
from tl_idempotence.core.records import json_like

FIELDS = (
    "n_heads", "n_closed", "n_asked", "n_sign_tested", "n_agree", "sign_test_p", "spearman_rho", "spearman_p",
    "spearman_p_within_layer", "spearman_p_unstratified", "n_strata", "matched", "base_rates", "projection",
    "stability", "copy_suppression", "notes",
)  # fmt: skip
COLUMNS = [
    "layer", "alpha", "direction", "agrees_alpha", "median_diff", "median_diff_lo", "median_diff_hi", "asymmetry",
    "proj_distance", "n_predicted", "effect_median_predicted", "effect_median_unpredicted",
]  # fmt: skip


def main() -> None:
    t0, w0 = time.process_time(), time.time()
    model = tli.models.load("smollm2-135m", progress=False)
    rep = tli.idempotence_report(model, progress=False)
    t1, w1 = time.process_time(), time.time()
    mech = rep.mechanism(model=model, progress=False)
    t2, w2 = time.process_time(), time.time()
    out = {k: json_like(mech.summary.get(k)) for k in FIELDS}
    out |= {"headline": mech.headline, "cpu_s_load_report": t1 - t0, "wall_s_load_report": w1 - w0}
    out |= {"cpu_s_mechanism": t2 - t1, "wall_s_mechanism": w2 - w1}
    print(json.dumps(out, indent=1, default=str))
    t = mech.table
    print(t[t["closed"]][COLUMNS].to_string())
    with tempfile.TemporaryDirectory() as d:
        back = tli.load_mechanism(mech.save(f"{d}/m"))
    print("reload headline equal:", back.headline == mech.headline)


if __name__ == "__main__":
    main()
