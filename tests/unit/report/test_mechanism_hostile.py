"""rep.mechanism's options of issue 47 (``match_by``, ``n_controls``, ``n_boot``, ``predicted_k``, ``texts=[set1,
set2, ...]``) and ``tli.attended_token_effect``'s ``predicted_k``/``predicted_heads``, given as a hostile user would:
each refused where it enters with the library's error naming the argument (never a raw TypeError/KeyError from
deep inside, never silently ignored, never an hour of bootstrap), numpy integers accepted as ints. A saved result
whose settings were edited to a huge ``n_boot`` is refused on load, not resampled."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import rewrite_saved
from tl_idempotence.errors import OptionError, OptionTypeError, ReportFileError
from tl_idempotence.probes.effect_stability import MAX_BOOT
from tl_idempotence.report.join_defaults import MAX_BOOT as DECLARED_MAX_BOOT

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

FAST = {"n_tokens": 30, "k": 3, "n_permutations": 99, "progress": False}


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model_and_report():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_mechanism_model", Path(__file__).with_name("test_mechanism.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    m = module.constructed()  # test_mechanism's constructed 5-head model (d_vocab 50, 16 positions)
    return m, tli.idempotence_report(m, progress=False)


X = _x()
BAD_OPTIONS = [
    # (keyword arguments, error class, a substring naming the argument)
    ({"match_by": "abs_alfa"}, OptionError, "match_by"),
    ({"match_by": "Norm"}, OptionError, "match_by"),
    ({"match_by": 2.5}, OptionTypeError, "match_by"),
    ({"match_by": None}, OptionTypeError, "match_by"),
    ({"match_by": ["norm"]}, OptionTypeError, "match_by"),
    ({"n_controls": "1"}, OptionTypeError, "n_controls"),
    ({"n_controls": 2.5}, OptionTypeError, "n_controls"),
    ({"n_controls": True}, OptionTypeError, "n_controls"),
    ({"n_controls": torch.tensor(1)}, OptionTypeError, "n_controls"),
    ({"n_controls": 0}, OptionError, "n_controls"),
    ({"n_controls": -1}, OptionError, "n_controls"),
    ({"n_controls": 10**12}, OptionError, "n_controls"),
    ({"n_controls": math.nan}, OptionTypeError, "n_controls"),
    ({"n_boot": "1000"}, OptionTypeError, "n_boot"),
    ({"n_boot": 1000.0}, OptionTypeError, "n_boot"),
    ({"n_boot": False}, OptionTypeError, "n_boot"),
    ({"n_boot": torch.tensor(100)}, OptionTypeError, "n_boot"),
    ({"n_boot": 0}, OptionError, "n_boot"),
    ({"n_boot": 9}, OptionError, "n_boot"),
    ({"n_boot": -5}, OptionError, "n_boot"),
    ({"n_boot": 1 << 20}, OptionError, "n_boot"),  # allowed before: 16 GB of draws at 2048 positions
    ({"n_boot": MAX_BOOT + 1}, OptionError, "n_boot"),
    ({"n_boot": 10**12}, OptionError, "n_boot"),
    ({"n_boot": 1e12}, OptionTypeError, "n_boot"),
    ({"n_boot": math.nan}, OptionTypeError, "n_boot"),
    ({"predicted_k": "10"}, OptionTypeError, "predicted_k"),
    ({"predicted_k": 2.5}, OptionTypeError, "predicted_k"),
    ({"predicted_k": True}, OptionTypeError, "predicted_k"),
    ({"predicted_k": torch.tensor(3)}, OptionTypeError, "predicted_k"),
    ({"predicted_k": 0}, OptionError, "predicted_k"),
    ({"predicted_k": -1}, OptionError, "predicted_k"),
    ({"predicted_k": 51}, OptionError, "predicted_k"),  # d_vocab = 50
    ({"predicted_k": 10**12}, OptionError, "predicted_k"),
    ({"predicted_k": math.nan}, OptionTypeError, "predicted_k"),
    ({"texts": []}, OptionError, "texts"),
    ({"texts": ()}, OptionError, "texts"),
    ({"texts": [X, "a text"]}, OptionTypeError, "texts"),
    ({"texts": ["a text", X]}, OptionTypeError, "texts"),
    ({"texts": [X, 3]}, OptionTypeError, "texts"),
    ({"texts": [X, []]}, OptionError, "texts[1]"),  # refused before the first set runs
    ({"texts": [X, torch.zeros((0, 16), dtype=torch.long)]}, OptionError, "texts[1]"),
    ({"texts": [X, X]}, OptionError, "texts[1] is texts[0]"),  # one text twice: a stability that cannot fail
    ({"texts": [X, _x(2), X.clone()]}, OptionError, "texts[2] is texts[0]"),
    ({"texts": [X.numpy(), X]}, OptionError, "texts[1] is texts[0]"),
    ({"texts": [None, None]}, OptionError, "texts[1] is texts[0]"),
]


@pytest.mark.parametrize("kw,error,names", BAD_OPTIONS, ids=lambda x: None)
def test_mechanism_options_are_refused_where_they_enter(model_and_report, kw, error, names):
    _, rep = model_and_report
    with pytest.raises(error) as e:
        rep.mechanism(**{"texts": X, **FAST, **kw})
    assert names in str(e.value) and type(e.value) is error


BAD_EFFECT = [
    # (keyword arguments of attended_token_effect(heads=["L0H0", "L0H1"]), error class, substring)
    ({"predicted_k": "10"}, OptionTypeError, "predicted_k"),
    ({"predicted_k": 2.5}, OptionTypeError, "predicted_k"),
    ({"predicted_k": True}, OptionTypeError, "predicted_k"),
    ({"predicted_k": torch.tensor(3)}, OptionTypeError, "predicted_k"),
    ({"predicted_k": 0}, OptionError, "predicted_k"),
    ({"predicted_k": -3}, OptionError, "predicted_k"),
    ({"predicted_k": 51}, OptionError, "predicted_k"),
    ({"predicted_k": 10**12}, OptionError, "predicted_k"),
    ({"predicted_k": math.nan}, OptionTypeError, "predicted_k"),
    ({"predicted_heads": ["L0H4"]}, OptionError, "predicted_heads ['L0H4']"),  # measured? no: not in heads=
    ({"predicted_heads": "L0H9"}, OptionError, "predicted_heads"),  # no such head
    ({"predicted_heads": [(1, 0)]}, OptionError, "predicted_heads"),  # no such layer
    ({"predicted_heads": 3}, OptionTypeError, "predicted_heads"),
    ({"predicted_heads": [3.5]}, OptionTypeError, "predicted_heads"),
    ({"predicted_heads": {"a": 1}}, OptionTypeError, "predicted_heads"),
    ({"predicted_heads": ["L0H0"], "predicted_k": None}, OptionError, "predicted_heads"),  # ignored before
]


@pytest.mark.parametrize("kw,error,names", BAD_EFFECT, ids=lambda x: None)
def test_attended_token_effect_options_are_refused_where_they_enter(model_and_report, kw, error, names):
    m, _ = model_and_report
    with pytest.raises(error) as e:
        tli.attended_token_effect(m, heads=["L0H0", "L0H1"], texts=X, progress=False, **kw)
    assert names in str(e.value) and type(e.value) is error


def test_numpy_integers_are_ints_and_a_huge_saved_n_boot_is_refused(model_and_report, tmp_path):
    """np.int64 options are accepted and stored as ints; the declared maximum is the bootstrap's; a saved result
    edited to n_boot = 10^12 (digests recomputed) is refused on load, before any resampling; a saved result and a
    fresh one of one model are one model twice in a population."""
    m, rep = model_and_report
    assert DECLARED_MAX_BOOT == MAX_BOOT
    i64 = np.int64
    mech = rep.mechanism(texts=X, n_controls=i64(1), n_boot=i64(20), predicted_k=i64(3), **FAST)
    s = mech.summary["settings"]
    assert (s["n_controls"], s["n_boot"], s["predicted_k"]) == (1, 20, 3)
    assert all(type(s[k]) is int for k in ("n_controls", "n_boot", "predicted_k"))
    eff = tli.attended_token_effect(m, heads=["L0H0"], texts=X, predicted_k=i64(3), progress=False)
    assert eff.summary["predicted_k"] == 3 and type(eff.summary["predicted_k"]) is int
    folder = mech.save(tmp_path / "m")
    with pytest.raises(OptionError, match="equal mechanism results"):
        tli.compare_mechanisms({"fresh": mech, "saved": tli.load_mechanism(folder)})
    huge = {"n_boot": 10**12}
    rewrite_saved(tmp_path / "m", "mechanism.json", edit_record=lambda r: r["summary"]["settings"].update(huge))
    with pytest.raises(ReportFileError, match="n_boot"):
        tli.load_mechanism(folder)
