"""A report option is refused where it is declared: one without a validator, or whose default its own
validator refuses, raises at declaration (``OptionSpec(...)``), or for a validator that needs torch when
core/options.py hands it down (``use_torch_checks``), never later in a user's call. One table."""

from __future__ import annotations

import dataclasses

import pytest

from tl_idempotence.analyses import registry
from tl_idempotence.core import option_specs
from tl_idempotence.core.option_specs import (
    OptionSpec,
    check_bool,
    check_layers,
    check_nulls,
    check_seed,
    check_threshold,
    report_options,
    torch_check,
    use_torch_checks,
)
from tl_idempotence.core.options import check_compute_dtype, check_device
from tl_idempotence.errors import OptionError

#: (id, the declaration's arguments, words of the OptionError)
REFUSED = [
    ("no validator", dict(name="toy", default=False, help="h", kind="flag"), ["option toy: no validator"]),
    (
        "validator not callable",
        dict(name="toy", default=False, help="h", kind="flag", check="check_bool"),
        ["option toy: no validator"],
    ),
    (
        "threshold default outside [0, 1]",
        dict(name="toy", default=1.5, help="h", kind="threshold", check=check_threshold),
        ["option toy: its default 1.5 is refused by its own validator", "must be in [0, 1]"],
    ),
    (
        "count default negative",
        dict(name="toy", default=-1, help="h", kind="count", check=check_seed),
        ["option toy: its default -1 is refused", "must be >= 0"],
    ),
    (
        "count default of the wrong type",
        dict(name="toy", default="64", help="h", kind="count", check=check_nulls),
        ["option toy: its default '64' is refused", "must be an integer"],
    ),
    (
        "layers default empty",
        dict(name="toy", default=[], help="h", kind="layers", check=check_layers),
        ["option toy: its default [] is refused", "is empty"],
    ),
    (
        "flag default not a bool",
        dict(name="toy", default=0, help="h", kind="flag", check=check_bool),
        ["option toy: a flag's default is False"],
    ),
]


@pytest.mark.parametrize("kw,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_declaration_is_refused(kw, words):
    with pytest.raises(OptionError) as e:
        OptionSpec(**kw)
    for w in words:
        assert w in str(e.value)


def test_every_declared_option_has_a_validator_that_takes_its_default():
    """The report's own options and the registered analyses' (analyses/<name>_spec.py), as declared."""
    assert [o.name for o in registry.analysis_options()] == ["nulls", "search", "algebra"]
    for o in report_options():
        assert callable(o.check), o.name
        o.check_default()
        dataclasses.replace(o)  # declaring it again passes


def test_the_options_that_need_torch_validate_through_the_handed_down_checks():
    by_name = {o.name: o for o in report_options()}
    assert by_name["compute_dtype"].check is by_name["device"].check is torch_check
    assert by_name["compute_dtype"].validate("float32") is check_compute_dtype("float32")
    assert by_name["device"].validate("cpu") == check_device("cpu")


def test_a_torch_checked_default_is_refused_when_its_validator_is_handed_down(monkeypatch):
    bad = OptionSpec("toy_dtype", "float16", "h", "choice", choices=("float16",), check=torch_check)  # not yet
    monkeypatch.setattr(option_specs, "GENERAL_OPTIONS", (*option_specs.GENERAL_OPTIONS, bad))
    monkeypatch.setattr(option_specs, "_torch_checks", dict(option_specs._torch_checks))
    with pytest.raises(OptionError, match="option toy_dtype: declares torch_check, but no validator"):
        use_torch_checks({})
    with pytest.raises(OptionError, match="option toy_dtype: its default 'float16' is refused by its own validator"):
        use_torch_checks({"toy_dtype": check_compute_dtype})
