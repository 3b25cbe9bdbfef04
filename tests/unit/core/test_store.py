"""THE store (core/store.py): a save is written beside its folder and put in place in one step.

What a SIGKILL at any instant leaves is what the file system holds at that instant: ``store.step_hook`` is called
before every change a save makes, and each test copies the folder's parent there (a snapshot = the state a kill at
that instant leaves). A reader of every snapshot must find the earlier save or the new one, never neither, never a
mix. Two saves into one fresh folder: exactly one wins. Both the atomic exchange and the two-rename fallback.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tl_idempotence.core import store
from tl_idempotence.errors import OptionError

RECORD = "rec.json"


def _files(tag: str, n_tables: int = 2) -> dict[str, bytes]:
    """A save: ``n_tables`` table files and the record naming them and the tag (written last)."""
    out = {f"t{i}.bin": f"{tag}-{i}".encode() for i in range(n_tables)}
    out[RECORD] = json.dumps({"tag": tag, "files": sorted(out)}).encode()
    return out


def _owned(d: Path) -> list[str]:
    if not (d / RECORD).is_file():
        raise OptionError(f"{d} holds no {RECORD}; refusing to overwrite {d}: nothing was deleted.")
    return [RECORD, *json.loads((d / RECORD).read_text())["files"]]


def _read(d: Path) -> str | None:
    """The tag of the save a reader finds at ``d`` (None: no save there), refusing a mix."""
    d = store.saved_folder(d, RECORD)
    if not (d / RECORD).is_file():
        return None
    rec = json.loads((d / RECORD).read_text())
    for i, name in enumerate(rec["files"]):
        assert (d / name).read_bytes() == f"{rec['tag']}-{i}".encode(), f"a mix at {d}: {name}"
    return str(rec["tag"])


def _save(d: Path, tag: str, overwrite: bool, n_tables: int = 2) -> Path:
    return store.write_folder(d, _files(tag, n_tables), overwrite=overwrite, owned=_owned)


@pytest.fixture(params=["exchange", "two-renames"])
def mode(request, monkeypatch):
    if request.param == "two-renames":  # a system or file system without an atomic exchange
        monkeypatch.setattr(store, "exchange", lambda a, b: False)
    return request.param


def _snapshots(monkeypatch, root: Path, out: Path) -> list[tuple[str, Path]]:
    """Install a step hook that copies ``root`` (the target's parent) to ``out/<n>`` before every step."""
    shots: list[tuple[str, Path]] = []

    def hook(step: str, path: Path) -> None:
        dst = out / f"{len(shots):03d}"
        shutil.copytree(root, dst, symlinks=True)
        shots.append((step, dst))

    monkeypatch.setattr(store, "step_hook", hook)
    return shots


def test_a_kill_at_any_instant_of_an_overwrite_leaves_the_old_save_or_the_new(tmp_path, monkeypatch, mode):
    root = tmp_path / "root"
    root.mkdir()
    d = root / "res"
    _save(d, "old", overwrite=False, n_tables=3)  # three tables: the new save has two (one is dropped)
    (d / "notes.md").write_text("mine")
    shots = _snapshots(monkeypatch, root, tmp_path / "shots")
    _save(d, "new", overwrite=True)
    monkeypatch.setattr(store, "step_hook", None)
    steps = [s for s, _ in shots]
    assert steps[0] == "make new folder" and steps[-1] == "done"
    assert "exchange new and target" in steps
    seen = []
    for step, shot in shots:
        tag = _read(shot / "res")
        assert tag in ("old", "new"), f"a kill before {step!r} leaves {tag!r}"
        seen.append(tag)
        if (shot / "res").is_dir():
            assert (shot / "res" / "notes.md").read_text() == "mine"  # the user's file, in the old or the new
    assert seen[0] == "old" and seen[-1] == "new" and seen == sorted(seen, key=["old", "new"].index)
    assert _read(d) == "new" and sorted(p.name for p in d.iterdir()) == ["notes.md", RECORD, "t0.bin", "t1.bin"]
    assert sorted(p.name for p in root.iterdir()) == ["res"]  # nothing left beside it
    if mode == "two-renames":
        assert "rename target to old" in steps and "rename new to target" in steps
        between = shots[steps.index("rename new to target")][1]
        assert not (between / "res").exists() and _read(between / "res") == "old"  # read through the kept folder


def test_a_kill_at_any_instant_of_a_fresh_save_leaves_nothing_or_the_new_save(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    shots = _snapshots(monkeypatch, root, tmp_path / "shots")
    _save(root / "res", "new", overwrite=False)
    monkeypatch.setattr(store, "step_hook", None)
    tags = [_read(shot / "res") for _, shot in shots]
    assert tags[0] is None and tags[-1] == "new" and set(tags) == {None, "new"}
    # what a killed save leaves is hidden beside the target, and the next save (its writer gone) removes it
    killed = shots[-2][1]
    left = [p.name for p in killed.iterdir()]
    assert left == ["res"] or all(n.startswith(".res.tli-new-") for n in left if n != "res")


def test_a_killed_saves_folder_is_removed_by_the_next_save_once_its_writer_is_gone(tmp_path):
    d = tmp_path / "res"
    stale = tmp_path / f".res{store.NEW_MARK}{store._host()}-999999999-deadbeef"  # no such process
    stale.mkdir()
    (stale / "t0.bin").write_bytes(b"half")
    live = tmp_path / f".res{store.NEW_MARK}{store._host()}-{os.getpid()}-cafecafe"  # a save running now
    live.mkdir()
    _save(d, "new", overwrite=False)
    assert not stale.exists() and live.exists() and _read(d) == "new"


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_saves_into_one_fresh_folder_one_wins_the_other_is_refused(tmp_path, monkeypatch, first, mode):
    """Saver A stops before it puts its folder in place; saver B runs to the end; then A goes on."""
    d = tmp_path / "res"
    go = threading.Event()
    paused = threading.Event()

    def hook(step: str, path: Path) -> None:
        if threading.current_thread().name == "A" and step == "rename new to target":
            paused.set()
            assert go.wait(10)

    monkeypatch.setattr(store, "step_hook", hook)
    out: dict[str, object] = {}

    def run(tag: str) -> None:
        try:
            out[tag] = _save(d, tag, overwrite=False)
        except OptionError as e:
            out[tag] = e

    a = threading.Thread(target=run, args=("a",), name="A")
    a.start()
    assert paused.wait(10)
    if first == "b":  # B finishes while A waits at its last step: B wins
        run("b")
        go.set()
        a.join()
        winner, loser = "b", "a"
    else:  # A goes on first, then B starts into a folder that holds A's save: B is refused before writing
        go.set()
        a.join()
        run("b")
        winner, loser = "a", "b"
    assert out[winner] == d and isinstance(out[loser], OptionError)
    assert str(d) in str(out[loser])
    assert _read(d) == winner
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]  # the loser left nothing


def test_two_overwrites_at_once_leave_one_complete_save(tmp_path, monkeypatch, mode):
    d = tmp_path / "res"
    _save(d, "old", overwrite=False)
    go, paused = threading.Event(), threading.Event()

    def hook(step: str, path: Path) -> None:
        if threading.current_thread().name == "A" and step == "exchange new and target":
            paused.set()
            assert go.wait(10)

    monkeypatch.setattr(store, "step_hook", hook)
    a = threading.Thread(target=_save, args=(d, "a", True), name="A")
    a.start()
    assert paused.wait(10)
    _save(d, "b", overwrite=True)
    go.set()
    a.join()
    assert _read(d) == "a"  # the last to finish
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_refusals_write_nothing(tmp_path):
    d = tmp_path / "res"
    _save(d, "old", overwrite=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OptionError, match="exists and is not empty; pass overwrite=True"):
        _save(d, "new", overwrite=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(OptionError, match=r"holds no rec\.json; refusing to overwrite .*nothing was deleted"):
        _save(tmp_path / "other", "new", overwrite=True)
    (tmp_path / "file").write_text("f")
    with pytest.raises(OptionError, match="it is a file"):
        _save(tmp_path / "file", "new", overwrite=True)
    with pytest.raises(OptionError, match="does not exist"):
        _save(tmp_path / "missing" / "res", "new", overwrite=False)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OptionError, match=r"symbolic link to .*nowhere, which does not exist"):
        _save(tmp_path / "link", "new", overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "other", "file", "link"])
    assert _read(d) == "old"


def test_the_current_folder_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "res"
    _save(d, "old", overwrite=False)
    monkeypatch.chdir(d)
    for path in (".", str(d), str(tmp_path)):
        with pytest.raises(OptionError, match="current folder or holds it"):
            _save(Path(path), "new", overwrite=True)
    assert _read(d) == "old"


def test_an_empty_folder_and_a_linked_folder_are_saved_into(tmp_path):
    (tmp_path / "empty").mkdir()
    _save(tmp_path / "empty", "a", overwrite=False)
    assert _read(tmp_path / "empty") == "a"
    (tmp_path / "real").mkdir()
    (tmp_path / "ln").symlink_to(tmp_path / "real")
    _save(tmp_path / "ln", "b", overwrite=False)
    _save(tmp_path / "ln", "c", overwrite=True)
    assert (tmp_path / "ln").is_symlink() and _read(tmp_path / "real") == "c"


def test_a_users_file_written_during_an_overwrite_is_kept(tmp_path, monkeypatch, mode):
    d = tmp_path / "res"
    _save(d, "old", overwrite=False)

    def hook(step: str, path: Path) -> None:
        if step == "exchange new and target":  # after the carry: a file the user writes now
            (d / "late.txt").write_text("late")

    monkeypatch.setattr(store, "step_hook", hook)
    _save(d, "new", overwrite=True)
    assert (d / "late.txt").read_text() == "late" and _read(d) == "new"
