"""Saves of an earlier layout read by this version: what their tables determine recomputed, what they do not marked.

Version 0.3.0 (commit 13de6bd) saved a few results whose tables have changed since (issues 46 and 47). A loader
reads such a folder in two steps: its record and every table are read and checked as written (the record's digest
and each file's sha256: a folder that lies is refused by name, as any save), then an **upgrade** registered for its
layout turns them into this version's layout in memory, and the loader's own checks run on the result (every
number the tables give is recomputed and compared; THE identity check of sizes, kv map and model fields). An upgrade
never guesses a number:

* a field the old tables determine (a count, a sign, a median, a token list read from the saved ranks) is computed
  from them, and the loader's recomputation must agree with it (else the folder is refused as edited);
* a field they do not determine (it needs the model: a self-cosine, the copy-suppression condition) is NaN / not
  measured, and the summary's :data:`NOT_MEASURED` field says which and why (``"not in a 0.3.0 save: recompute with
  tli.head_tokens(model, ...)"``); the headline ends with the same words (:func:`marked_headline`), so no part of
  the result reads as measured when it was not.

A result loaded this way saves in this version's layout (with its :data:`NOT_MEASURED` field) and loads back as
one. Upgrades are registered by the layer that owns the result (:func:`register`, e.g.
:mod:`tl_idempotence.probes.legacy`); this module holds the registry and the words. Imports the standard library
only (and the package's errors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ReportFileError

__all__ = [
    "NOT_MEASURED",
    "Upgrade",
    "is_pending",
    "marked_headline",
    "not_in_save",
    "pending_headline",
    "register",
    "summary_after_check",
    "upgrade",
]

#: The summary field of a result read from an earlier layout: ``{field: why it is not measured}`` (absent when every
#: field was measured).
NOT_MEASURED = "not_measured"

#: ``upgrade(rec_file, fields, tables) -> (fields, tables) | None``: this version's layout of a save of an earlier
#: one (None: not that layout). Raises ReportFileError naming ``rec_file`` when the layout is that one but a field is
#: not what that version wrote.
Upgrade = Callable[[Path, dict[str, Any], dict[str, Any]], "tuple[dict[str, Any], dict[str, Any]] | None"]

_UPGRADES: dict[str, list[Upgrade]] = {}


class _Pending(str):
    """The headline of a summary an upgrade made: set by :func:`summary_after_check` from the headline the loader
    recomputes (a JSON record can never hold one: it is not a plain ``str``)."""

    __slots__ = ()


def pending_headline() -> str:
    """The placeholder headline an upgrade puts in the summary (:func:`summary_after_check` replaces it)."""
    return _Pending("(set when loaded)")


def not_in_save(version: str, again: str) -> str:
    """Why a field of a save of ``version`` is NaN: ``"not in a 0.3.0 save: recompute with {again}"``."""
    return f"not in a {version} save: recompute with {again}"


def marked_headline(headline: str, not_measured: Mapping[str, str]) -> str:
    """``headline`` followed by what was not measured and why (:data:`NOT_MEASURED`); ``headline`` when nothing."""
    if not not_measured:
        return headline
    return f"{headline} Not measured: " + "; ".join(f"{k} ({why})" for k, why in not_measured.items()) + "."


def register(record_name: str, fn: Upgrade) -> None:
    """Register an upgrade of the saves whose record file is ``record_name`` (module docstring)."""
    if fn not in _UPGRADES.setdefault(record_name, []):
        _UPGRADES[record_name].append(fn)


def upgrade(rec_file: Path, fields: dict[str, Any], tables: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(fields, tables)`` of a folder whose record and tables were read and checked as written, in this version's
    layout: the first registered upgrade of its record's name that knows the layout, else as given.

    Raises:
        ReportFileError: a record of this version's layout that holds :data:`NOT_MEASURED` in a form no save writes,
            or an upgrade refused the folder (names the file).
    """
    for fn in _UPGRADES.get(rec_file.name, []):
        out = fn(rec_file, fields, tables)
        if out is not None:
            return out
    nm = fields.get("summary", {}).get(NOT_MEASURED) if isinstance(fields.get("summary"), dict) else None
    if nm is not None and not (
        isinstance(nm, dict) and nm and all(isinstance(k, str) and isinstance(v, str) for k, v in nm.items())
    ):
        raise ReportFileError(f"{rec_file}: summary[{NOT_MEASURED!r}] is {nm!r:.80}, not what a save writes.")
    return fields, tables


def is_pending(headline: Any) -> bool:
    """Whether ``headline`` is an upgrade's placeholder (:func:`pending_headline`)."""
    return isinstance(headline, _Pending)


def summary_after_check(summary: Any, fresh_headline: str) -> tuple[Any, str]:
    """``(summary, headline wanted)`` once a loader has recomputed ``fresh_headline`` from the tables: the headline
    marked with what was not measured (:func:`marked_headline`); an upgrade's summary (placeholder headline) gets it,
    a saved one is returned as it is (the caller compares its headline with the one wanted). Raises nothing."""
    want = marked_headline(fresh_headline, dict(summary.get(NOT_MEASURED) or {}))
    if is_pending(summary.get("headline")):
        return type(summary)({**summary, "headline": want}), want
    return summary, want
