"""Wrote the stored 0.1 tables in this folder (run once, at commit 046f01e, tl_idempotence 0.1.0).

    python tests/data/v0_1/make_reference.py

Each ``*.parquet`` is a table exactly as 0.1 computed it (parquet keeps every float64 bit);
``tests/unit/report/test_v01_values.py`` checks that the current code reproduces them bit for bit.
Kept for provenance: it uses the 0.1 API (module paths of that version). The search columns of
smollm2_bridge_l5_l10_search were later rewritten by regenerate_search_columns.py (README.md says why).
"""

from pathlib import Path

import tl_idempotence as tli

OUT = Path(__file__).parent


def save(rep, stem):
    rep.heads.to_parquet(OUT / f"{stem}.heads.parquet", index=False)
    rep.layers.to_parquet(OUT / f"{stem}.layers.parquet", index=False)
    if rep.algebra is not None and len(rep.algebra.pairs):
        rep.algebra.pairs.to_parquet(OUT / f"{stem}.algebra_pairs.parquet", index=False)
        rep.algebra.heads.to_parquet(OUT / f"{stem}.algebra_heads.parquet", index=False)


smol = tli.models.load("smollm2-135m")
save(tli.idempotence_report(smol, nulls=16, algebra=True, progress=False), "smollm2_bridge_nulls16_algebra")
save(tli.idempotence_report(smol, layers=[5, 10], nulls=8, search=True, progress=False), "smollm2_bridge_l5_l10_search")
del smol
mini = tli.models.load("minilm-l6")
save(tli.idempotence_report(mini, nulls=16, progress=False), "minilm_bridge_nulls16")
del mini
hf = tli.models.checkpoint_dir("smollm2-135m")
save(tli.idempotence_report(str(hf), nulls=16, progress=False), "smollm2_files_nulls16")
gguf = tli.models.gguf_path("smollm2-135m")
save(tli.idempotence_report(str(gguf), progress=False), "smollm2_gguf")
mhf = tli.models.checkpoint_dir("minilm-l6")
save(tli.idempotence_report(str(mhf), nulls=16, progress=False), "minilm_files_nulls16")
