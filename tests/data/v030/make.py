"""Make the 0.3.0 saves of tests/data/v030 (issue 45: saved folders of 0.3.0 still load).

Run with the sources of commit 13de6bd (version 0.3.0, before the one store and issues 46/47) first on the path::

    git worktree add /tmp/wt-old 13de6bd
    cd <repo> && PYTHONPATH=/tmp/wt-old/src /work/main/.venv/bin/python tests/data/v030/make.py

It builds ``tiny_hf_dir(arch="llama", n_layers=2)`` (seed 0: 9 query heads on 3 kv heads, d_vocab 100) as a
TransformerBridge and saves every result 0.3.0 could save, each in its own folder here: ``report`` (rep.save),
``head_roles`` and ``role_association`` (save_roles), ``head_tokens``, ``attended_token_effect`` and ``mechanism``
(their .save). 0.3.0 had no saved ablation, comparison or trajectory. ``numbers.json`` holds the key numbers the
old code computed (what the loaders must give back). tests/unit/test_legacy_v030.py and
tests/integration/test_legacy_v030.py read them.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import tl_idempotence as tli
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

HERE = Path(__file__).resolve().parent


def texts() -> torch.Tensor:
    """The effect's text: 4 windows of 16 seeded token ids in [4, 100) (the tiny tokenizer's ids 0-3 are special)."""
    return torch.randint(4, 100, (4, 16), generator=torch.Generator().manual_seed(0))

OPTS = {"n_tokens": 24, "k": 4, "seq_len": 16, "max_tokens": 64, "batch_size": 4}


def main() -> None:
    assert tli.__version__.startswith("0.3.0") or "13de6bd" in sys.argv[1:], tli.__version__
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    model = bridge_from_dir(tiny_hf_dir(tmp / "tiny", arch="llama", n_layers=2))
    rep = tli.idempotence_report(model, nulls=8, seed=0)
    roles = tli.head_roles(model, n_tokens=8, n_sequences=2, seed=0)
    assoc = rep.roles(model, roles=roles, n_permutations=99)
    toks = tli.head_tokens(model, k=OPTS["k"], n_tokens=OPTS["n_tokens"], seed=0)
    eff = tli.attended_token_effect(model, texts=texts(), seq_len=16, max_tokens=64, batch_size=4, seed=0)
    mech = rep.mechanism(model, texts=texts(), n_permutations=99, seed=0, **OPTS)
    for name in ("report", "head_roles", "role_association", "head_tokens", "attended_token_effect", "mechanism"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    rep.save(HERE / "report")
    tli.save_roles(roles, HERE / "head_roles")
    tli.save_roles(assoc, HERE / "role_association")
    toks.save(HERE / "head_tokens")
    eff.save(HERE / "attended_token_effect")
    mech.save(HERE / "mechanism")

    def floats(s):
        return [None if not np.isfinite(v) else float(v) for v in s]

    numbers = {
        "version": tli.__version__,
        "report": {"P": floats(rep.heads["P"]), "alpha": floats(rep.heads["alpha"]), "headline": rep.headline},
        "head_roles": {"induction": floats(roles.table["induction"]), "copying": floats(roles.table["copying"])},
        "role_association": {"association": json.loads(assoc.association.to_json(orient="split"))},
        "head_tokens": {
            "labels": list(toks.table.index),
            "self_rank_median": floats(toks.table["self_rank_median"]),
            "frac_top_k": floats(toks.table["frac_top_k"]),
            "frac_bottom_k": floats(toks.table["frac_bottom_k"]),
            "sv_1": floats(toks.table["sv_1"]),
            "headline": toks.summary["headline"],
        },
        "attended_token_effect": {
            "labels": list(eff.table.index),
            "columns": list(eff.table.columns),
            "table": json.loads(eff.table.to_json(orient="split", double_precision=15)),
            "headline": eff.summary["headline"],
        },
        "mechanism": {"headline": mech.summary["headline"], "columns": list(mech.table.columns)},
    }
    (HERE / "numbers.json").write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
