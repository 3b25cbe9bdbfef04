"""A sweep's plan and items: what each item is called and where its report goes (``OUT/<dir>``), and the
plan file ``OUT/sweep.json`` that every task of one sweep writes and reads under one lock.

Both entry points (:func:`~tl_idempotence.studies.sweep.sweep`, the Dask driver, and
:func:`~tl_idempotence.studies.sweep.run_sweep_item`, one job-array task) resolve their items here
(:func:`resolve_sweep_items`, :func:`item_dirnames`), prepare ``OUT`` (:func:`prepare_out`) and write the
plan (:func:`write_plan`); :func:`~tl_idempotence.studies.sweep.load_sweep` reads it back
(:func:`read_sweep_plan`). The module docstring of :mod:`tl_idempotence.studies.sweep` says how the files
of a sweep fit together.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...analyses.report_options import ReportOptions
from ...core.files import atomic_write_text, check_work_folder, read_json
from ...core.jsonio import RECORD, json_text
from ...core.options import check_device_name
from ...errors import MissingFileError, OptionError, OptionTypeError, ReportFileError, TLIError
from ...report.identity import Origin
from ..cluster import UNSAFE_CHARS
from ..compare import Item, resolve_items

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Mapping
    from typing import TypeAlias

    from ...core.hints import ModelLike, PathLike

    #: One item of a sweep: a checkpoint path, a zoo name, or a zero-argument callable (run on the worker) returning
    #: a model, a source or a path.
    SweepItem: TypeAlias = PathLike | Callable[[], ModelLike]
    #: The items of a sweep: one item, a sequence of items, or ``{label: item}``.
    SweepItems: TypeAlias = SweepItem | Sequence[SweepItem] | Mapping[str, SweepItem] | Mapping[int, SweepItem]

__all__ = [
    "ITEMS_DIR",
    "LOCK_NAME",
    "PLAN_FORMATS",
    "RECORD_NAME",
    "RESERVED_NAMES",
    "SWEEP_ITEM_KINDS",
    "Entry",
    "SweepPlan",
    "item_differences",
    "item_dirname",
    "item_dirnames",
    "item_origin",
    "plan_lock",
    "plan_matches",
    "plan_record",
    "prepare_out",
    "read_sweep_plan",
    "resolve_sweep_items",
    "write_plan",
]

#: Item kinds a sweep accepts: things a worker can open by itself.
SWEEP_ITEM_KINDS = ("path", "zoo", "callable")
#: The sweep's own record in ``OUT``: the plan (labels, folders, options), and after a Dask sweep what happened.
RECORD_NAME = "sweep.json"
#: Lock file that keeps two Dask sweeps from writing one ``OUT`` at once (array tasks take only item locks).
LOCK_NAME = ".tli-sweep.lock"
#: Folder of ``OUT`` with each item's lock, task record and start markers (``OUT/.tli-items/<dir>/``).
ITEMS_DIR = ".tli-items"
#: The formats of ``OUT/sweep.json`` this version reads; it writes the last.
PLAN_FORMATS = ("tl_idempotence.sweep/1", "tl_idempotence.sweep/2")
#: Names in ``OUT`` that the sweep itself writes (compared case-insensitively): no item folder may take them.
RESERVED_NAMES = ("sweep", "sweep.json", "tli-sweep.lock", "tli-items")


def item_dirname(label: str) -> str:
    """A filesystem-safe folder name for a label: characters other than ``A-Za-z0-9._-`` become ``_``,
    leading dots and dashes are dropped, at most 100 characters.

    Raises:
        OptionError: nothing usable is left (e.g. ``"..."``).
    """
    name = UNSAFE_CHARS.sub("_", label).lstrip(".-")[:100]
    if not name or name in (".", ".."):
        raise OptionError(f"Label {label!r} leaves no usable folder name; give a label with letters or digits.")
    return name


def item_dirnames(items: Sequence[Item]) -> list[str]:
    """Each item's folder under ``OUT``; refuses labels with path separators, reserved names and collisions.

    Raises:
        OptionError: a label holding ``/`` or ``\\`` (a sweep label names one folder, never a path), a label
            whose folder would be a name the sweep writes itself (:data:`RESERVED_NAMES`, case ignored: the
            record ``sweep.json``, the lock), two labels mapping to one folder (case ignored, for macOS and
            Windows filesystems).
    """
    for it in items:
        if "/" in it.label or "\\" in it.label or "\x00" in it.label:
            raise OptionError(
                f"Sweep label {it.label!r} holds a path separator: a label names one folder under out, not a path. "
                "Give the items as a dict {label: item} with labels such as 'pythia-70m_step1000'."
            )
    names = [item_dirname(it.label) for it in items]
    for it, name in zip(items, names):
        if name.lower() in RESERVED_NAMES or name.lower().startswith(("tli-tmp-", "tli-old-")):
            raise OptionError(
                f"Sweep label {it.label!r} would use the folder {name!r}, a name the sweep keeps for itself "
                f"({', '.join(RESERVED_NAMES)}, case ignored): give it another label."
            )
    seen: dict[str, str] = {}
    for it, name in zip(items, names):
        other = seen.setdefault(name.lower(), it.label)  # case-insensitive filesystems (macOS, Windows)
        if other != it.label:
            raise OptionError(
                f"Labels {other!r} and {it.label!r} map to the same folder {name!r} (characters other than "
                "A-Za-z0-9._- become '_', case is ignored): give them distinct labels."
            )
    return names


def item_origin(item: Item) -> Origin | None:
    """What a report of ``item`` records as its origin (:func:`~tl_idempotence.report.identity.origin_of`),
    known without opening it: a checkpoint path's folder or file name (a ``.safetensors``/``config.json`` file
    names its folder, :func:`~tl_idempotence.sources.names.checkpoint_of`), a zoo name; None for a callable
    (what it returns is known only once it runs)."""
    from ...sources.names import checkpoint_of

    if item.kind == "path":
        return Origin("checkpoint", checkpoint_of(Path(item.value)).name)
    if item.kind == "zoo":
        return Origin("zoo model", str(item.value))
    return None


def _absolute(item: Item) -> Item:
    """A path item with an absolute path (workers and array tasks may start in another folder)."""
    if item.kind == "path":
        return Item(item.label, item.kind, Path(item.value).absolute())
    return item


def resolve_sweep_items(items: SweepItems) -> list[Item]:
    """The labelled items of a sweep (:func:`~tl_idempotence.studies.compare.resolve_items` with the kinds a
    worker can open, :data:`SWEEP_ITEM_KINDS`), path items made absolute.

    Raises:
        OptionError / OptionTypeError / MissingFileError / UnknownModelError: as ``resolve_items``.
    """
    return [_absolute(it) for it in resolve_items(items, allowed=SWEEP_ITEM_KINDS, what="sweep")]


def prepare_out(out: Any) -> Path:
    """The sweep folder ``out``, checked (:func:`~tl_idempotence.core.files.check_work_folder`) and created.

    Raises:
        OptionError / OptionTypeError: ``out`` refused by ``check_work_folder``, not creatable or not writable.
    """
    d = check_work_folder(out, "out")
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise OptionError(f"Cannot create the sweep folder {d}: {e.strerror or e}.") from e
    if not os.access(d, os.W_OK):
        raise OptionError(f"The sweep folder {d} is not writable.")
    return d


# --------------------------------------------------------------------------- the plan (OUT/sweep.json)


@dataclass(frozen=True)
class Entry:
    """One item of a sweep as the plan and the result list it (``origin``: what its report must record,
    :func:`item_origin`)."""

    label: str
    dir: str
    item: str
    origin: Origin | None = None


@dataclass(frozen=True)
class SweepPlan:
    """What ``OUT/sweep.json`` says a sweep is: its items and options (:func:`read_sweep_plan`).

    Attributes:
        path: the ``sweep.json`` file.
        items: ``(label, dir, item)`` per item, in order (``item``: the item in words, e.g. ``path /abs/ckpt``).
        options: the report options without the device (``ReportOptions.as_dict()`` keys).
        device_asked: the device the sweep asked for (``"cpu"``, ``"cuda"``, ``"auto"``, ...).
        origins: per item, what its report must record as its origin (:func:`item_origin`: the checkpoint's
            folder or file name, the zoo name; None for a callable, or a plan written before origins were kept).
    """

    path: Path
    items: tuple[tuple[str, str, str], ...]
    options: dict[str, Any]
    device_asked: str
    origins: tuple[Origin | None, ...] = ()


def plan_record(entries: Sequence[Entry], record: dict[str, Any], device_name: str) -> dict[str, Any]:
    """The JSON record of ``OUT/sweep.json`` (format :data:`PLAN_FORMATS` ``[-1]``) for these items and options."""
    items = []
    for e in entries:
        it: dict[str, Any] = {"label": e.label, "dir": e.dir, "item": e.item}
        if e.origin is not None:
            it["origin"] = {"kind": e.origin.kind, "name": e.origin.name}
        items.append(it)
    return {"format": PLAN_FORMATS[-1], "options": dict(record), "device_asked": device_name, "items": items}


def read_sweep_plan(out: Any) -> SweepPlan:
    """The plan of the sweep in ``out`` (its ``sweep.json``), checked.

    Raises:
        MissingFileError: ``out`` is not a folder, or holds no ``sweep.json`` (no sweep task has started there).
        ReportFileError: a ``sweep.json`` that is not one (malformed, another format, an item folder that is not
            its label's safe name — e.g. ``../x`` —, repeated folders, invalid options); names the file.
        OptionTypeError: ``out`` is not a path.
    """
    if not isinstance(out, (str, os.PathLike)):
        raise OptionTypeError(f"out must be a folder path; got {type(out).__name__}.")
    d = Path(out).expanduser()
    if not d.is_dir():
        raise MissingFileError(f"{d} is not a folder: no sweep to read there.")
    path = d / RECORD_NAME
    if not path.is_file():
        raise MissingFileError(
            f"{path} does not exist: no sweep has started in {d} (every sweep and array task writes it first)."
        )
    rec = read_json(path, ReportFileError, "sweep record")

    def bad(why: str) -> ReportFileError:
        return ReportFileError(
            f"Sweep record {path} {why}; it cannot say what the sweep is. Rerun a task to rewrite it."
        )

    if not isinstance(rec, dict) or rec.get("format") not in PLAN_FORMATS:
        raise bad(f"is not a sweep record of a known format ({', '.join(PLAN_FORMATS)})")
    raw_items = rec.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise bad("has no list of items")
    items = []
    origins: list[Origin | None] = []
    for it in raw_items:
        item, origin = _plan_item(it, bad)
        items.append(item)
        origins.append(origin)
    if len({i[1].lower() for i in items}) != len(items):
        raise bad("lists one folder twice")
    options = rec.get("options")
    device = rec.get("device_asked", "cpu")
    if not isinstance(options, dict) or not isinstance(device, str):
        raise bad("has no options")
    record = {k: v for k, v in options.items() if k != "device"}
    try:
        ReportOptions.from_record({**record, "device": "cpu"})
        check_device_name(device)
    except TLIError as e:
        raise bad(f"holds options that are not valid ({e})") from e
    return SweepPlan(path=path, items=tuple(items), options=record, device_asked=device, origins=tuple(origins))


def _plan_item(it: Any, bad: Callable[[str], ReportFileError]) -> tuple[tuple[str, str, str], Origin | None]:
    """One item of a plan's list, checked: ``((label, dir, item), origin)``; ``bad(why)`` is the error to raise."""
    if not (isinstance(it, dict) and all(isinstance(it.get(k), str) for k in ("label", "dir", "item"))):
        raise bad("has an item without a label, dir and item text")
    origin = it.get("origin")
    found: Origin | None
    if origin is None:
        found = None
    elif (
        isinstance(origin, dict)
        and origin.get("kind") in ("checkpoint", "zoo model")
        and isinstance(origin.get("name"), str)
        and origin["name"]
    ):
        found = Origin(origin["kind"], origin["name"])
    else:
        raise bad(f"gives item {it['label']!r} an origin that is not a checkpoint or zoo model name")
    try:
        safe = item_dirname(it["label"])
    except OptionError:
        safe = None
    if it["dir"] != safe:
        raise bad(f"gives item {it['label']!r} the folder {it['dir']!r}, not its label's folder {safe!r}")
    return (it["label"], it["dir"], it["item"]), found


def item_differences(plan: SweepPlan, entries: Sequence[Entry]) -> str | None:
    """What differs between a plan's items and the items given (labels, folders, what each item is), or None."""
    given = [(e.label, e.dir, e.item) for e in entries]
    if list(plan.items) == given:
        return None
    have = {i[0]: i for i in plan.items}
    want = {i[0]: i for i in given}
    only_plan = [lab for lab in have if lab not in want]
    only_given = [lab for lab in want if lab not in have]
    changed = [lab for lab in want if lab in have and have[lab] != want[lab]]
    parts = []
    if only_plan:
        parts.append(f"items only in the folder's sweep: {only_plan[:5]}")
    if only_given:
        parts.append(f"items only given now: {only_given[:5]}")
    if changed:
        lab = changed[0]
        parts.append(f"item {lab!r} is {have[lab][2]!r} there and {want[lab][2]!r} now")
    if not parts:
        parts.append("the items are in another order")
    return "; ".join(parts)


def plan_matches(plan: SweepPlan, entries: Sequence[Entry], record: dict[str, Any], device_name: str) -> list[str]:
    """What differs between a plan and the items and options given (empty: the same sweep)."""
    diff = []
    items = item_differences(plan, entries)
    if items is not None:
        diff.append(items)
    for k in sorted(set(plan.options) | set(record)):
        if plan.options.get(k) != record.get(k):
            diff.append(f"{k} {plan.options.get(k)!r} there, {record.get(k)!r} now")
    if plan.device_asked != device_name:
        diff.append(f"device {plan.device_asked!r} there, {device_name!r} now")
    return diff


@contextlib.contextmanager
def plan_lock(d: Path) -> Iterator[None]:
    """The lock under which ``OUT/sweep.json`` is read and written (``OUT/.tli-items/.plan.lock``: no item
    folder starts with a dot), so that two tasks given different items cannot both find no plan and write theirs.

    Raises:
        OptionError: the filesystem of ``OUT`` has no file locks.
    """
    from filelock import FileLock

    folder = d / ITEMS_DIR
    folder.mkdir(exist_ok=True)
    lock = FileLock(str(folder / ".plan.lock"))
    try:
        lock.acquire(poll_interval=0.1)
    except NotImplementedError as e:
        raise OptionError(
            f"The filesystem of {d} does not support file locks ({e}); sweep tasks need them to share the folder. "
            "Use a folder on a filesystem with locks (NFSv4, GPFS, Lustre mounted with -o flock)."
        ) from e
    try:
        yield
    finally:
        lock.release()


def write_plan(d: Path, entries: Sequence[Entry], record: dict[str, Any], device_name: str, replan: bool) -> None:
    """Write ``OUT/sweep.json`` unless it already holds this plan (array tasks all write the same one).

    A plan of the same items with other options or device is rewritten (the items' reports are then
    recomputed with the new ones); a plan that cannot be read is rewritten; a plan of *other items* is refused
    unless ``replan`` (the file is left as it is).

    Raises:
        OptionError: ``OUT/sweep.json`` is the plan of other items and ``replan`` is False (says what differs);
            the filesystem has no file locks.
    """
    with plan_lock(d):
        plan: SweepPlan | None = None
        with contextlib.suppress(TLIError, OSError):  # none yet, or one that lies: written anew
            plan = read_sweep_plan(d)
        if plan is not None:
            items = item_differences(plan, entries)
            if items is not None and not replan:
                raise OptionError(
                    f"{plan.path} is the plan of a sweep of other items ({items}): nothing was measured and "
                    f"{RECORD_NAME} is unchanged. Give every task of the sweep the same items, use another out "
                    "folder for another list, or pass replan=True (CLI: --replan) to make these items the "
                    "folder's plan (items no longer listed then drop out of load_sweep / --collect)."
                )
            if not plan_matches(plan, entries, record, device_name) and plan.origins == tuple(
                e.origin for e in entries
            ):
                return
        atomic_write_text(d / RECORD_NAME, json_text(plan_record(entries, record, device_name), RECORD, indent=1))
