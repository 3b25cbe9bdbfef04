"""A report option is refused where it is declared: one without a validator, or whose default its own validator
refuses, raises at declaration (``OptionSpec(...)``), never later in a user's call; the defaults of the options whose
validators import torch (``needs_torch``, not checked at declaration) are checked here. One table."""

from __future__ import annotations

import dataclasses

import pytest

from tl_idempotence.analyses import registry
from tl_idempotence.analyses.report_options import report_options
from tl_idempotence.core.option_specs import OptionSpec
from tl_idempotence.core.options import (
    check_bool,
    check_compute_dtype,
    check_device,
    check_layers,
    check_nulls,
    check_seed,
    check_threshold,
)
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


def test_the_options_that_need_torch_validate_with_their_validators_and_only_those_skip_the_declaration_check():
    by_name = {o.name: o for o in report_options()}
    assert by_name["compute_dtype"].check is check_compute_dtype and by_name["device"].check is check_device
    assert by_name["compute_dtype"].validate("float32") is check_compute_dtype("float32")
    assert by_name["device"].validate("cpu") == check_device("cpu")
    assert [o.name for o in report_options() if o.needs_torch] == ["compute_dtype", "device"]


def test_a_torch_checked_default_that_its_validator_refuses_is_caught_by_check_default():
    bad = OptionSpec(
        "toy_dtype", "float16", "h", "choice", choices=("float16",), check=check_compute_dtype, needs_torch=True
    )
    with pytest.raises(OptionError, match="option toy_dtype: its default 'float16' is refused by its own validator"):
        bad.check_default()
    with pytest.raises(OptionError, match="option toy_dtype: its default 'float16' is refused by its own validator"):
        dataclasses.replace(bad, needs_torch=False)  # declared without the flag: refused at declaration
