"""HeadTokens and AttendedTokenEffect save and load (SPEC 12): parquet tables and a digested JSON record, no
pickle. A round trip gives equal tables, top tokens and summaries; the loader recomputes from the tables what the
record states, so an edit whose sha256s and digest were recomputed is refused naming the file and the field; a
truncated table is refused by its sha256; ``check_model`` refuses a model the result was not computed from. The
summaries are typed, read-only records that keep mapping access.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import edit_safetensors, redigest
from tl_idempotence.errors import (
    MissingFileError,
    OptionError,
    OptionTypeError,
    OutputOverInputError,
    ReportFileError,
    ReportMismatchError,
)
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("token_records") / "tiny", n_layers=2)


@pytest.fixture(scope="module")
def readout(bridge):
    return tli.head_tokens(bridge, heads=["L0H1", "L1H0", "L1H3"], k=4, n_tokens=40, seed=3)


@pytest.fixture(scope="module")
def effect(bridge):
    toks = torch.randint(1, 60, (3, 20), generator=torch.Generator().manual_seed(2))
    return tli.attended_token_effect(bridge, heads=["L0H1", "L1H0", "L1H3"], texts=toks, seed=1)


def test_head_tokens_round_trip(readout, tmp_path):
    back = tli.load_head_tokens(readout.save(tmp_path / "t"))
    assert back.table.equals(readout.table) and back.self_ranks.equals(readout.self_ranks)
    assert back.summary == readout.summary and type(back.summary) is type(readout.summary)
    assert back.options == readout.options and back.info == readout.info
    for lab in readout.table.index:
        a, b = readout.top_tokens(lab), back.top_tokens(lab)
        assert a.equals(b) and a.attrs == b.attrs
    assert back.loaded_from == str(tmp_path / "t") and readout.loaded_from is None
    with pytest.raises(OutputOverInputError):
        back.save(tmp_path / "t", overwrite=True)
    with pytest.raises(OptionError, match="not empty"):
        readout.save(tmp_path / "t")
    with pytest.raises(OptionError, match="folder, not a file"):
        readout.save(tmp_path / "t.json")
    with pytest.raises(OptionTypeError):
        tli.save_head_tokens(object(), tmp_path / "o")


def test_attended_token_effect_round_trip(effect, tmp_path):
    back = tli.load_attended_token_effect(tli.save_attended_token_effect(effect, tmp_path / "e"))
    assert back.table.equals(effect.table) and back.positions.equals(effect.positions)
    assert list(back.table.dtypes) == list(effect.table.dtypes)
    assert back.summary == effect.summary and back.options == effect.options and back.info == effect.info
    assert back.headline == effect.headline


@pytest.mark.parametrize(
    ("table", "edit", "field"),
    [
        ("self_ranks", lambda df: df.assign(L1H0=df["L0H1"].to_numpy()), "self_rank_median"),
        ("table", lambda df: df.assign(frac_top_k=df["frac_top_k"] + 0.25), "frac_top_k"),
        ("top", lambda df: df.assign(token_id=df["token_id"][::-1].to_numpy()), "promoted"),
        # a missing cosine only where the token's unembedding is zero: then for every head, never for all tokens
        ("self_cosines", lambda df: df.assign(L1H0=np.where(df.index == 3, np.nan, df["L1H0"])), "missing self-cos"),
        ("self_cosines", lambda df: df.assign(**{c: np.nan for c in df.columns[1:]}), "no self-cosine at any"),
    ],
)
def test_head_tokens_refuses_a_table_edit_with_recomputed_digests(readout, tmp_path, table, edit, field):
    d = Path(readout.save(tmp_path / "t"))
    redigest(d, "head_tokens.json", tables={table: edit})
    with pytest.raises(ReportFileError, match=rf"\.parquet.*({field})"):
        tli.load_head_tokens(d)


@pytest.mark.parametrize(
    ("which", "table", "match"),
    [
        ("readout", "table", r"table\.parquet has columns \[.*\], not a head-tokens table \['layer'"),
        ("effect", "table", r"table\.parquet has columns \[.*\], not an attended-token-effect table\.$"),
        ("effect", "positions", r"positions\.parquet has columns \[.*\], not \['label'"),
    ],
)
def test_a_table_of_other_columns_is_refused_naming_it(readout, effect, tmp_path, which, table, match):
    result, load = (readout, tli.load_head_tokens) if which == "readout" else (effect, tli.load_attended_token_effect)
    d = Path(result.save(tmp_path / "c"))
    record = "head_tokens.json" if which == "readout" else "attended_token_effect.json"
    redigest(d, record, tables={table: lambda df: df.drop(columns=df.columns[-1])})
    with pytest.raises(ReportFileError, match=match):
        load(d)


def test_head_tokens_refuses_singular_values_out_of_order(readout, tmp_path):
    d = Path(readout.save(tmp_path / "t"))
    redigest(d, "head_tokens.json", fields=lambda r: r["sigmas"]["L1H0"].update(sigma_2=9.0))
    with pytest.raises(ReportFileError, match=r"head_tokens\.json.*L1H0's sigmas are not singular values"):
        tli.load_head_tokens(d)


@pytest.mark.parametrize(
    ("table", "edit", "field"),
    [
        ("positions", lambda df: df.assign(effect=df["effect"] * 2), "effect_median"),
        ("table", lambda df: df.assign(q_value=df["p_value"]), "q_value"),
    ],
)
def test_attended_token_effect_refuses_a_table_edit(effect, tmp_path, table, edit, field):
    d = Path(effect.save(tmp_path / "e"))
    redigest(d, "attended_token_effect.json", tables={table: edit})
    with pytest.raises(ReportFileError, match=rf"table\.parquet.*{field}"):
        tli.load_attended_token_effect(d)


def test_an_edited_json_value_is_refused_naming_the_record_and_field(readout, effect, tmp_path):
    d = Path(readout.save(tmp_path / "t"))
    redigest(d, "head_tokens.json", fields=lambda r: r["summary"].update(median_self_rank=0.5))
    with pytest.raises(ReportFileError, match=r"head_tokens\.json.*median_self_rank"):
        tli.load_head_tokens(d)
    d = Path(effect.save(tmp_path / "e"))
    redigest(d, "attended_token_effect.json", fields=lambda r: r["summary"].update(n_negative_q05=7))
    with pytest.raises(ReportFileError, match=r"attended_token_effect\.json.*n_negative_q05"):
        tli.load_attended_token_effect(d)
    d = Path(effect.save(tmp_path / "f"))
    redigest(d, "attended_token_effect.json", fields=lambda r: r["summary"].update(bogus=1))
    with pytest.raises(ReportFileError, match=r"attended_token_effect\.json.*bogus"):
        tli.load_attended_token_effect(d)
    d = Path(effect.save(tmp_path / "g"))  # an edit without the digest recomputed: the digest refuses it
    rec = json.loads((d / "attended_token_effect.json").read_text())
    rec["summary"]["seed"] = 9
    (d / "attended_token_effect.json").write_text(json.dumps(rec))
    with pytest.raises(ReportFileError, match=r"attended_token_effect\.json.*digest"):
        tli.load_attended_token_effect(d)


def test_a_truncated_or_missing_table_is_refused(readout, tmp_path):
    d = Path(readout.save(tmp_path / "t"))
    b = (d / "self_ranks.parquet").read_bytes()
    (d / "self_ranks.parquet").write_bytes(b[: len(b) // 2])
    with pytest.raises(ReportFileError, match=r"self_ranks\.parquet.*sha256"):
        tli.load_head_tokens(d)
    (d / "self_ranks.parquet").unlink()
    with pytest.raises(MissingFileError, match=r"self_ranks\.parquet"):
        tli.load_head_tokens(d)
    with pytest.raises(MissingFileError, match=r"head_tokens\.json"):
        tli.load_head_tokens(tmp_path)


def test_a_loaded_result_refuses_a_model_it_was_not_made_from(readout, effect, bridge, tiny_dir, tmp_path):
    back_t = tli.load_head_tokens(readout.save(tmp_path / "t"))
    back_e = tli.load_attended_token_effect(effect.save(tmp_path / "e"))
    back_t.check_model(bridge)
    back_e.check_model(bridge)
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)

    def bump_layer1_v(t):
        key = next(k for k in t if "layers.1." in k and "v_proj" in k)
        t[key] = t[key] + 0.01

    edit_safetensors(other, bump_layer1_v)
    m2 = bridge_from_dir(other)
    for r in (back_t, back_e, readout):
        with pytest.raises(ReportMismatchError, match="weights_fingerprint"):
            r.check_model(m2)
    with pytest.raises(OptionTypeError):
        back_t.check_model(object())


def test_the_summaries_are_typed_read_only_mappings(readout, effect):
    s = readout.summary
    assert s.k == 4 and s.n_tokens == 40 and s["k"] == 4 and s.get("k") == 4 and "k" in s
    assert isinstance(s, dict) and dict(s) == s.to_dict() and json.loads(json.dumps(s)) == s.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.k = 5
    with pytest.raises(TypeError):
        s["k"] = 5
    with pytest.raises(AttributeError):
        _ = s.not_a_field
    assert effect.summary.n_heads == 3 and effect.summary["n_heads"] == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        readout.summary = {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        effect.info = None
    t = effect.table
    t.iloc[0, 3] = -1
    assert effect.table.iloc[0, 3] != -1
    assert np.isfinite(readout.summary.median_self_rank)
