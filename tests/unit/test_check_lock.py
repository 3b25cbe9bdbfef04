"""scripts/check_lock.py (CI's lock check, .ci/run): a pinned package the install should have (the requirement
closure of ``tl_idempotence[test]``, extras and markers followed) fails when it is missing or off its pin; a package
pinned only for another extra (mutation: mutmut and its dependencies) is reported as not expected here. Checked on
a fake lock and a fake installed set."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lock_check():
    spec = importlib.util.spec_from_file_location("tli_check_lock_script", ROOT / "scripts" / "check_lock.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


LOCK = """# a lock as scripts/update_constraints.py writes it (from .[test,mutation])
dask==2024.1.0
filelock==3.0.0
libcst==1.5.0
mutmut==3.8.1
nvidia-cublas==12.0
pluggy==1.5.0
pytest==8.3.0
torch==2.13.0
"""


def installed_set(lock_check, drop: str = "", **versions: str):
    """The fake install of ``.[test]``: tl_idempotence's requirements with extras and markers, as metadata has them."""
    Dist = lock_check.Dist
    dists = {
        "tl-idempotence": Dist(
            "tl_idempotence",
            "0.3.0",
            (
                "torch>=2.1",
                'tl_idempotence[cluster]; extra == "test"',
                'pytest; extra == "test"',
                'dask; extra == "cluster"',
                'mutmut==3.8.1; extra == "mutation"',
            ),
        ),
        "torch": Dist("torch", "2.13.0+cpu", ("filelock", 'nvidia-cublas; platform_system == "NoSuchSystem"')),
        "filelock": Dist("filelock", "3.0.0"),
        "pytest": Dist("pytest", "8.3.0", ("pluggy<2,>=1.5",)),
        "pluggy": Dist("pluggy", "1.5.0"),
        "dask": Dist("dask", "2024.1.0"),
    }
    for name, ver in versions.items():
        dists[name] = Dist(dists[name].name, ver, dists[name].requires)
    dists.pop(drop, None)
    return dists


def run_check(lock_check, installed):
    pins = lock_check.read_lock(LOCK)
    expected = lock_check.closure(["tl_idempotence[test]"], installed)
    return lock_check.check(pins, installed, expected, "constraints.txt")


def test_every_expected_pin_installed_at_its_version_passes_and_says_what_it_checked(lock_check):
    result = run_check(lock_check, installed_set(lock_check))
    assert result.ok and result.failures() == []
    # mutmut and libcst: the mutation extra; nvidia-cublas: torch's, under a marker that does not hold here
    assert result.summary() == (
        "constraints.txt: 5 of 8 pins installed and at their version; 3 pins for other extras not installed "
        "(libcst, mutmut, nvidia-cublas)"
    )


@pytest.mark.parametrize(
    ("drop", "says"),
    [
        ("pluggy", "pluggy (pinned 1.5.0; required by tl_idempotence[test] -> pytest -> pluggy)"),
        ("dask", "dask (pinned 2024.1.0; required by tl_idempotence[test] -> tl_idempotence[cluster] -> dask)"),
        ("filelock", "filelock (pinned 3.0.0; required by tl_idempotence[test] -> torch -> filelock)"),
    ],
)
def test_a_missing_pinned_package_the_install_should_have_fails(lock_check, drop, says):
    result = run_check(lock_check, installed_set(lock_check, drop=drop))
    assert not result.ok
    assert result.failures() == [f"constraints.txt: a pinned package the install should have is not installed: {says}"]
    assert result.summary().startswith("constraints.txt: 4 of 8 pins installed and at their version; 3 pins")


def test_a_package_off_its_pin_fails(lock_check):
    result = run_check(lock_check, installed_set(lock_check, pytest="8.4.0"))
    assert not result.ok
    assert result.failures() == ["constraints.txt: installed version differs from the pin: pytest 8.4.0 (pinned 8.3.0)"]


def test_a_package_pinned_for_another_extra_is_checked_when_it_is_installed_anyway(lock_check):
    installed = installed_set(lock_check)
    installed["mutmut"] = lock_check.Dist("mutmut", "3.9.0")  # CI's mutation stage installs .[mutation] later
    result = run_check(lock_check, installed)
    assert result.failures() == ["constraints.txt: installed version differs from the pin: mutmut 3.9.0 (pinned 3.8.1)"]
    assert "mutmut" not in result.other_extras


def test_the_marker_and_extra_rules_of_the_closure(lock_check):
    installed = installed_set(lock_check)
    assert set(lock_check.closure(["tl_idempotence"], installed)) == {"tl-idempotence", "torch", "filelock"}
    assert set(lock_check.closure(["tl_idempotence[test]"], installed)) == {
        "tl-idempotence",
        "torch",
        "filelock",
        "pytest",
        "pluggy",
        "dask",
    }
    linux = lock_check.closure(["torch"], installed, {"platform_system": "NoSuchSystem"})
    assert set(linux) == {"torch", "filelock", "nvidia-cublas"}


def test_a_lock_line_that_is_not_a_pin_is_refused(lock_check):
    with pytest.raises(ValueError, match=r"constraints.txt:2: not a name==version pin: 'torch>=2'"):
        lock_check.read_lock("a==1\ntorch>=2\n", "constraints.txt")


def test_main_exits_1_naming_the_missing_package_and_ends_with_what_it_checked(
    lock_check, tmp_path, monkeypatch, capsys
):
    lock = tmp_path / "constraints.txt"
    lock.write_text(LOCK)
    monkeypatch.setattr(lock_check, "installed_dists", lambda: installed_set(lock_check, drop="pluggy"))
    assert lock_check.main([str(lock)]) == 1
    out, err = capsys.readouterr()
    assert "is not installed: pluggy (pinned 1.5.0;" in err
    assert out.strip().splitlines()[-1] == (
        f"{lock}: 4 of 8 pins installed and at their version; 3 pins for other extras not installed "
        "(libcst, mutmut, nvidia-cublas)"
    )
    monkeypatch.setattr(lock_check, "installed_dists", lambda: installed_set(lock_check))
    assert lock_check.main([str(lock)]) == 0
