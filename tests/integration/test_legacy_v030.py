"""Saved folders of 0.3.0 (tests/data/v030, made by its make.py at commit 13de6bd) hold what this version computes
on the same model (``tiny_hf_dir(arch="llama", n_layers=2)``, seed 0), once loaded (issue 45): the report's P and α,
the upgraded head tokens (n_ranked, reason and the token lists read again from the saved ranks) and attended-token
effect (every column recomputed from the saved positions), apart from what a 0.3.0 save does not hold (NaN, with
its reason: tests/unit/test_legacy_v030.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli

DATA = Path(__file__).resolve().parents[1] / "data" / "v030"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The model the saves were made from (make.py)."""
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    torch.manual_seed(0)
    return bridge_from_dir(tiny_hf_dir(tmp_path_factory.mktemp("v030") / "tiny", arch="llama", n_layers=2))


def test_the_report_and_roles_are_todays(model):
    rep = tli.load_report(DATA / "report")
    now = tli.idempotence_report(model, nulls=8, seed=0, progress=False)
    np.testing.assert_allclose(now.heads["P"], rep.heads["P"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(now.heads["alpha"], rep.heads["alpha"], rtol=1e-12, atol=0)
    roles = tli.load_roles(DATA / "head_roles")
    now_roles = tli.head_roles(model, repeat_len=8, n_sequences=2, seed=0, progress=False)
    for col in ("previous_token", "duplicate_token", "induction", "copying"):
        np.testing.assert_allclose(now_roles.table[col], roles.table[col], rtol=1e-6, err_msg=col)


def test_head_tokens_are_todays_but_the_cosines(model):
    tokens = tli.load_head_tokens(DATA / "head_tokens")
    t = tokens.table
    tokens.check_model(model)  # the flags 0.3.0 did not record are not compared; the weights' fingerprints are
    now = tli.head_tokens(model, k=4, n_tokens=24, seed=0, progress=False)
    pd.testing.assert_frame_equal(t, now.table, check_exact=False, rtol=1e-12)  # n_ranked and reason recomputed
    pd.testing.assert_frame_equal(tokens.self_ranks, now.self_ranks)
    assert now.headline.startswith(tokens.headline.split(" Not measured:")[0])
    for lab in t.index:  # the promoted/suppressed lists, read again from the saved ranks, are today's
        a, b = tokens.top_tokens(lab), now.top_tokens(lab)
        keep = ~b["kind"].str.endswith("_cosine")
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b[keep].reset_index(drop=True), check_exact=False)


def test_the_attended_token_effect_is_todays_but_the_split(model):
    effect = tli.load_attended_token_effect(DATA / "attended_token_effect")
    t = effect.table
    split = [c for c in t.columns if c.endswith(("_predicted", "_unpredicted"))]
    effect.check_model(model)
    texts = torch.randint(4, 100, (4, 16), generator=torch.Generator().manual_seed(0))  # make.py's texts()
    now = tli.attended_token_effect(model, texts=texts, seq_len=16, max_tokens=64, batch_size=4, seed=0, progress=False)
    same = [c for c in t.columns if c not in split and c not in ("n_predicted", "n_unpredicted")]
    pd.testing.assert_frame_equal(t[same], now.table[same], check_exact=False, rtol=1e-12, atol=1e-14)
    for k in ("n_negative_q05", "n_positive_q05", "n_positions"):
        assert effect.summary[k] == now.summary[k], k
    assert now.headline.startswith(effect.headline.split(" Not measured:")[0])


def test_a_030_result_is_refused_with_another_model(tmp_path):
    from tl_idempotence.errors import ReportMismatchError
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    other = bridge_from_dir(tiny_hf_dir(tmp_path / "other", arch="llama", n_layers=2, seed=1))
    with pytest.raises(ReportMismatchError, match="other attention weights"):
        tli.load_head_tokens(DATA / "head_tokens").check_model(other)
