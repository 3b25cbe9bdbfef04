"""``repeat_len``: the head detector's repeated-sequence length (the x of ``BOS x x``) has its own name in
``tli.head_roles`` and ``rep.roles``; ``n_tokens`` there is its deprecated name (a DeprecationWarning at the user's
line naming the new keyword, the same numbers, its errors naming what was typed), so ``n_tokens`` means one thing
in the API: the token readout's sample of source tokens (``tli.head_tokens``, ``rep.mechanism``).

Saved roles keep the record of 0.3.0: ``n_tokens`` in ``options`` and ``summary`` (read as ``HeadRoles.repeat_len``),
so a folder saved before the rename and one saved after are the same format and both load.
"""

from __future__ import annotations

import json
import warnings

import pytest

import tl_idempotence as tli
from tl_idempotence.errors import OptionError, OptionTypeError
from tl_idempotence.testing import tiny_hf_dir

pytestmark = pytest.mark.bridge

FAST = {"n_sequences": 1}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):  # its TransformerBridge: the shared ``bridge`` fixture
    return tiny_hf_dir(tmp_path_factory.mktemp("rl") / "tiny", n_layers=1)  # 9 heads on 3 kv heads


@pytest.fixture(scope="module")
def rep(bridge):
    return tli.idempotence_report(bridge, progress=False)


@pytest.fixture(scope="module")
def made(bridge):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new name warns about nothing
        return tli.head_roles(bridge, repeat_len=6, **FAST)


def test_repeat_len_is_the_length_of_x_and_n_tokens_its_deprecated_name(bridge, made):
    assert made.repeat_len == 6 and made.options["n_tokens"] == 6 and made.summary["n_tokens"] == 6
    assert made.summary["sequence"].startswith("BOS x x, x = 6 random ")
    with pytest.warns(DeprecationWarning, match=r"head_roles\(n_tokens=\.\.\.\) is deprecated: use repeat_len=") as w:
        old = tli.head_roles(bridge, n_tokens=6, **FAST)
    assert w[0].filename == __file__  # at the user's line
    assert old.table.equals(made.table) and old.summary == made.summary
    assert tli.head_roles(bridge, 6, **FAST).table.equals(made.table)  # positionally, as before


def test_the_errors_name_the_keyword_given(bridge):
    with pytest.raises(OptionError, match="repeat_len must be >= 2; got 1"):
        tli.head_roles(bridge, repeat_len=1)
    with pytest.raises(OptionTypeError, match="repeat_len must be an integer"):
        tli.head_roles(bridge, repeat_len=2.0)
    with pytest.raises(OptionError, match=r"repeat_len=64 makes sequences .* use repeat_len <= 63"):
        tli.head_roles(bridge, repeat_len=64)
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"n_tokens=64 .* use n_tokens <= 63"):
        tli.head_roles(bridge, n_tokens=64)
    with pytest.raises(OptionError, match="give repeat_len only"):
        tli.head_roles(bridge, repeat_len=8, n_tokens=8)


def test_rep_roles_takes_repeat_len_and_warns_on_n_tokens(rep, bridge, made):
    new = rep.roles(model=bridge, repeat_len=6, n_permutations=9, **FAST)
    assert new.roles.repeat_len == 6 and new.roles.table.equals(made.table)
    with pytest.warns(DeprecationWarning, match=r"rep.roles\(n_tokens=\.\.\.\) is deprecated: use repeat_len=") as w:
        old = rep.roles(model=bridge, n_tokens=6, n_permutations=9, **FAST)
    assert w[0].filename == __file__
    assert old.table.equals(new.table) and old.association.equals(new.association)
    with pytest.raises(OptionError, match=r"repeat_len=7 \(the roles were made with 6\)"):
        rep.roles(roles=made, repeat_len=7, n_permutations=9)
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"n_tokens=7 \(the roles were made"):
        rep.roles(roles=made, n_tokens=7, n_permutations=9)
    with pytest.raises(OptionError, match="give repeat_len only"):
        rep.roles(model=bridge, repeat_len=6, n_tokens=6)
    with pytest.raises(OptionError, match="repeat_len must be >= 2; got 1"):  # the declaration's validator, first
        rep.roles(model=bridge, repeat_len=1)
    assert rep.roles(roles=made, repeat_len=6, n_permutations=9).roles is made  # what it was made with


def test_saved_roles_keep_the_0_3_0_record_and_load_both_ways(rep, bridge, made, tmp_path):
    """New saves store the record's field as 0.3.0 did (``n_tokens``, no ``repeat_len``): one format, so a 0.3.0
    folder and a new one load alike, and both read back as ``repeat_len``."""
    folder = tli.save_roles(made, tmp_path / "roles")
    record = json.loads((tmp_path / "roles" / "roles.json").read_text())
    assert record["options"] == {"n_tokens": 6, "n_sequences": 1, "seed": 0}
    assert record["summary"]["n_tokens"] == 6 and "repeat_len" not in json.dumps(record)
    back = tli.load_roles(folder)
    assert back.repeat_len == 6 and back.table.equals(made.table)
    joined = rep.roles(roles=made, n_permutations=9)
    again = tli.load_roles(joined.save(tmp_path / "assoc"))
    assert again.roles.repeat_len == 6 and again.association.equals(joined.association)
    assert rep.roles(roles=back, repeat_len=6, n_permutations=9).roles is back  # a loaded one joins as made
