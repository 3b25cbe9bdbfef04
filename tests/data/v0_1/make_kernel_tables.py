"""Run as: OMP_NUM_THREADS=1 PYTHONPATH=<checkout of ffe9f41>/src python make_kernel_tables.py tests/data/v0_1 tests/data/v0_1/kernels/<signature>

The six reports of tests/data/v0_1/make_reference.py computed by the code on sys.path (main at ffe9f41), at one
thread, saved with exactly the columns of 0.1's tables (tests/data/v0_1/README.md, "One folder per CPU kernel
signature")."""
import sys
from pathlib import Path

import pandas as pd
import torch

torch.set_num_threads(1)
import tl_idempotence as tli  # noqa: E402

REF = Path(sys.argv[1])
OUT = Path(sys.argv[2])
OUT.mkdir(parents=True, exist_ok=True)


def put(frame, stem):
    cols = list(pd.read_parquet(REF / f"{stem}.parquet").columns)
    frame.reset_index(drop=True)[cols].to_parquet(OUT / f"{stem}.parquet", index=False)


def save(rep, stem):
    put(rep.heads, f"{stem}.heads")
    put(rep.layers, f"{stem}.layers")
    if rep.algebra is not None and len(rep.algebra.pairs):
        put(rep.algebra.pairs, f"{stem}.algebra_pairs")
        put(rep.algebra.heads, f"{stem}.algebra_heads")


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
print("wrote", sorted(p.name for p in OUT.iterdir()))
