"""ReportOptions is typed: one attribute per report option, each of its validator's type, defaulting to the
registry's declared default, so a type checker refuses a misspelled option (tests/integration/test_typed_options.py
runs mypy). The registry stays the one list of options: these tests fail when the two differ."""

from __future__ import annotations

import dataclasses
import pickle
import typing

import pytest
import torch

from tl_idempotence.analyses import report_options as ro
from tl_idempotence.analyses.report_options import ReportOptions, report_options
from tl_idempotence.core.option_specs import Option

#: The names the annotations of the options and of their validators use.
NAMES = {"torch": torch}


def typed_attributes() -> dict[str, object]:
    """{name: type} of every typed option attribute ReportOptions declares (its ``Option[type]`` attributes, its base
    class GeneralOptions' included), and no property besides."""
    assert not [k for c in ReportOptions.__mro__ for k, v in vars(c).items() if isinstance(v, property)]
    return {
        name: typing.get_args(hint)[0]
        for name, hint in typing.get_type_hints(ReportOptions, localns=NAMES).items()
        if typing.get_origin(hint) is Option and isinstance(getattr(ReportOptions, name), Option)
    }


def test_the_typed_attributes_are_the_registrys_options_with_their_validators_types():
    declared = typed_attributes()
    specs = report_options()
    assert sorted(declared) == sorted(o.name for o in specs)  # names: one attribute per option, no other
    for o in specs:
        validator_type = typing.get_type_hints(o.check, localns=NAMES)["return"]
        assert declared[o.name] == validator_type, o.name  # types: what its validator returns


def test_each_attribute_defaults_to_the_registrys_declared_default():
    opts = ReportOptions()
    for o in report_options():
        assert getattr(opts, o.name) == o.validate(o.default) == opts[o.name], o.name
    assert (opts.threshold, opts.nulls, opts.seed, opts.search, opts.algebra, opts.layers) == (
        0.9,
        0,
        0,
        False,
        False,
        None,
    )
    assert opts.compute_dtype is torch.float64 and opts.device == torch.device("cpu")


def test_the_options_are_frozen_and_have_no_other_attribute():
    opts = ReportOptions(nulls=4, layers=[2, 0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.nulls = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.nullz = 5  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        opts.nullz  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(KeyError, match="ReportOptions has no option 'nullz'"):
        opts["nullz"]
    back = pickle.loads(pickle.dumps(opts))
    assert back == opts and back.nulls == 4 and back.layers == (2, 0) and hash(back) == hash(opts)
    assert ReportOptions.from_record(opts.as_dict()) == opts


def test_no_module_level_getattr_in_the_options_modules():
    from tl_idempotence.analyses import registry
    from tl_idempotence.core import option_specs, options

    for mod in (ro, registry, option_specs, options):
        assert "__getattr__" not in vars(mod), mod.__name__
