"""Check an install against a lock file: every pinned package the install should have is there, at its pin.

CI (``.ci/run``) runs this in each pinned venv right after ``pip install -c LOCK ... -e ".[test]"``: constraints only
bind what is installed, so this checks that pip took them (no later command upgraded one) and that nothing the
install should have is missing. What the install should have is the requirement closure of its roots (default
``tl_idempotence[test]``), computed from the installed distributions' own metadata (``importlib.metadata``):
each requirement followed with its extras, its environment markers evaluated for this interpreter. A pinned
package outside that closure was pinned for another extra (the lock files are written from ``.[test,mutation]``
by scripts/update_constraints.py: mutmut and its dependencies) and is reported as not expected here, not as
missing; if it is installed anyway it must still be at its pin.

    python scripts/check_lock.py constraints.txt
    python scripts/check_lock.py constraints-tl4.txt --require "tl_idempotence[test]" --require torch

Exit status 0 when every expected pin is installed at its version; 1 (the failures on stderr) otherwise. The last
line of the output says what was checked: ``N of M pins installed and at their version; K pins for other extras
not installed``. Needs ``packaging`` (pytest's dependency: in every venv of the test extra).
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import distributions
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DEFAULT_ROOTS = ("tl_idempotence[test]",)


@dataclass(frozen=True)
class Dist:
    """An installed distribution as this check reads it: its name, version and requirement strings."""

    name: str
    version: str
    requires: tuple[str, ...] = ()


@dataclass
class LockCheck:
    """What :func:`check` found; :attr:`ok` when no expected pin is missing and no installed one is off its pin."""

    lock: str
    n_pins: int
    at_pin: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    other_extras: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.missing

    def summary(self) -> str:
        others = f" ({', '.join(self.other_extras)})" if self.other_extras else ""
        return (
            f"{self.lock}: {len(self.at_pin)} of {self.n_pins} pins installed and at their version; "
            f"{len(self.other_extras)} pins for other extras not installed{others}"
        )

    def failures(self) -> list[str]:
        out = [f"{self.lock}: installed version differs from the pin: {w}" for w in self.wrong]
        out += [f"{self.lock}: a pinned package the install should have is not installed: {m}" for m in self.missing]
        return out


def read_lock(text: str, where: str = "lock") -> dict[str, tuple[str, str]]:
    """A lock file's pins: canonical name -> (name as written, version). Comments and blank lines are skipped.

    Raises:
        ValueError: a line that is not ``name==version`` (names the line).
    """
    pins: dict[str, tuple[str, str]] = {}
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, ver = line.partition("==")
        if not sep or not name.strip() or not ver.strip():
            raise ValueError(f"{where}:{i}: not a name==version pin: {raw!r}")
        pins[canonicalize_name(name.strip())] = (name.strip(), ver.strip())
    return pins


def installed_dists() -> dict[str, Dist]:
    """Every distribution importable here: canonical name -> :class:`Dist` (the first on the path wins)."""
    out: dict[str, Dist] = {}
    for d in distributions():
        name = d.metadata["Name"]
        if name and canonicalize_name(name) not in out:
            out[canonicalize_name(name)] = Dist(name, d.version, tuple(d.requires or ()))
    return out


def closure(
    roots: Iterable[str], installed: Mapping[str, Dist], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The requirement closure of ``roots``: canonical name -> the chain that requires it (``a[x] -> b -> c``).

    Each requirement of an installed distribution is followed when its marker holds for ``env`` (this interpreter's
    by default) with ``extra`` set to one of the extras asked of that distribution (or none); its own extras are
    followed in turn. A required distribution that is not installed is in the closure (its requirements are then
    unknown).
    """
    base = dict(default_environment() if env is None else env)
    found: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    queue: deque[tuple[Requirement, str]] = deque((Requirement(r), r) for r in roots)
    while queue:
        req, chain = queue.popleft()
        key = canonicalize_name(req.name)
        found.setdefault(key, chain)
        dist = installed.get(key)
        for extra in ("", *sorted(req.extras)):
            if dist is None or (key, extra) in seen:
                continue
            seen.add((key, extra))
            for text in dist.requires:
                sub = Requirement(text)
                if sub.marker is not None and not sub.marker.evaluate({**base, "extra": extra}):
                    continue
                if extra and (sub.marker is None or "extra" not in str(sub.marker)):
                    continue  # a plain requirement: followed once, with no extra
                shown = sub.name + (f"[{','.join(sorted(sub.extras))}]" if sub.extras else "")
                queue.append((sub, f"{chain} -> {shown}"))
    return found


def _local_dropped(version: str) -> str:
    return version.split("+", 1)[0]  # torch 2.13.0+cpu is the pin 2.13.0 (the lock drops local labels)


def check(
    pins: Mapping[str, tuple[str, str]], installed: Mapping[str, Dist], expected: Mapping[str, str], lock: str = "lock"
) -> LockCheck:
    """Each pin against the install: at its version, off it (``wrong``), expected but not installed (``missing``),
    or for another extra (not expected, not installed)."""
    result = LockCheck(lock, len(pins))
    for key, (name, ver) in sorted(pins.items()):
        dist = installed.get(key)
        if dist is not None and _local_dropped(dist.version) == ver:
            result.at_pin.append(name)
        elif dist is not None:
            result.wrong.append(f"{name} {_local_dropped(dist.version)} (pinned {ver})")
        elif key in expected:
            result.missing.append(f"{name} (pinned {ver}; required by {expected[key]})")
        else:
            result.other_extras.append(name)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path, help="the lock file (name==version lines)")
    parser.add_argument(
        "--require",
        action="append",
        metavar="REQ",
        help=f"a root of what the install should have (repeatable; default {' '.join(DEFAULT_ROOTS)})",
    )
    args = parser.parse_args(argv)
    pins = read_lock(args.lock.read_text(encoding="utf-8"), str(args.lock))
    installed = installed_dists()
    result = check(pins, installed, closure(args.require or DEFAULT_ROOTS, installed), str(args.lock))
    for line in result.failures():
        print(line, file=sys.stderr)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
