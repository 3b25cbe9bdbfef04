"""refuse_outputs_over_inputs: the one rule that an output never replaces a file or folder a run reads.

Real files, folders, symbolic links and hard links in tmp_path; every refusal names the output and the input,
and every case that must pass writes nothing and raises nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tl_idempotence.core.files import INPUT_FOLDER_DEPTH, refuse_outputs_over_inputs
from tl_idempotence.errors import OptionError, OutputOverInputError


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    d = tmp_path / "CK"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "config.json").write_text("{}")
    return d


def refused(out, inputs, *fragments: str) -> str:
    with pytest.raises(OutputOverInputError) as e:
        refuse_outputs_over_inputs([("--out", out)], inputs)
    msg = str(e.value)
    assert msg.startswith(f"--out {Path(out)} "), msg
    assert "which this run reads: an output never replaces an input" in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_a_file_of_an_input_folder_is_refused_by_path_link_or_hard_link(ck, tmp_path):
    inputs = [("the checkpoint", ck)]
    msg = refused(ck / "model.safetensors", inputs, f"is a file of the checkpoint {ck}")
    assert isinstance(OutputOverInputError(msg), OptionError) and isinstance(OutputOverInputError(msg), ValueError)
    refused(ck / "config.json", inputs, "config.json")
    (tmp_path / "to_config").symlink_to(ck / "config.json")
    refused(tmp_path / "to_config", inputs, f"is a symbolic link to {ck / 'config.json'}, a file of the checkpoint")
    os.link(ck / "model.safetensors", tmp_path / "hard")
    refused(tmp_path / "hard", inputs, f"is the same file (a hard link) as {ck / 'model.safetensors'}")
    (tmp_path / "via").symlink_to(ck, target_is_directory=True)  # a path through a linked folder
    refused(tmp_path / "via" / "config.json", inputs, f"a file of the checkpoint {ck}")
    # the folder itself, by its path or a link to it
    refused(ck, inputs, f"is the checkpoint {ck}")
    refused(tmp_path / "via", inputs, f"is a symbolic link to the checkpoint {ck}")


def test_an_input_file_and_a_link_through_a_snapshot_folder(tmp_path):
    """A Hugging Face hub snapshot: the folder's files are links to blobs; the blob is what the run reads."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "r1"
    blobs.mkdir()
    snap.mkdir(parents=True)
    (blobs / "abc123").write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(blobs / "abc123")
    refused(blobs / "abc123", [("the checkpoint", snap)], f"is the file that {snap / 'model.safetensors'}")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    refused(gguf, [("the checkpoint", gguf)], f"is the checkpoint {gguf}")
    os.link(gguf, tmp_path / "again.gguf")
    refused(tmp_path / "again.gguf", [("the checkpoint", gguf)], f"(a hard link) as the checkpoint {gguf}")


def test_an_input_that_does_not_exist_yet_is_still_its_path(tmp_path):
    parts = tmp_path / "parts"  # a resume folder the run will create
    refused(parts, [("the resume folder", parts)], "is the resume folder")
    refuse_outputs_over_inputs([("--out", tmp_path / "r.html")], [("the resume folder", parts)])


def test_new_files_other_paths_and_non_paths_pass(ck, tmp_path):
    before = sorted(p.name for p in ck.iterdir())
    (tmp_path / "old.html").write_text("an earlier page")  # an existing output that is no input: replaced later
    refuse_outputs_over_inputs(
        [("--out", ck / "report.html"), ("--csv", tmp_path / "old.html"), ("resume", tmp_path / "parts")],
        [("the checkpoint", ck), ("the zoo cache", tmp_path / "no-cache"), ("x", None)],
    )
    refuse_outputs_over_inputs([("--out", None), ("--csv", ""), ("path", 123)], [("the checkpoint", ck)])
    refuse_outputs_over_inputs([], [("the checkpoint", ck)])
    assert sorted(p.name for p in ck.iterdir()) == before  # nothing written


def test_folders_are_looked_into_to_a_stated_depth(tmp_path):
    cache = tmp_path / "cache"
    deep = cache / "smollm2-135m" / "files"
    deep.mkdir(parents=True)
    (deep / "w.gguf").write_bytes(b"GGUF")
    assert INPUT_FOLDER_DEPTH == 3  # <cache>/<name>/<kind>/<file>
    (tmp_path / "link.gguf").symlink_to(deep / "w.gguf")
    refused(tmp_path / "link.gguf", [("the zoo cache", cache)], f"{deep / 'w.gguf'}, a file of the zoo cache {cache}")
    deeper = deep / "a" / "b"
    deeper.mkdir(parents=True)
    (deeper / "x").write_bytes(b"x")
    (tmp_path / "link.x").symlink_to(deeper / "x")
    refuse_outputs_over_inputs([("--out", tmp_path / "link.x")], [("the zoo cache", cache)])  # below the depth


def test_the_first_output_over_an_input_is_named(ck):
    with pytest.raises(OutputOverInputError, match=r"^--csv .*config\.json is a file of the checkpoint"):
        refuse_outputs_over_inputs(
            [("--out", ck.parent / "fine.html"), ("--csv", ck / "config.json")], [("the checkpoint", ck)]
        )


def test_what_a_stream_is(tmp_path: Path):
    """is_stream: what is written in place with the format its flag implies, never replaced."""
    from tl_idempotence.core.files import atomic_write_bytes, is_stream

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "f.csv").write_text("x")
    os.symlink("/dev/null", tmp_path / "null-link")
    for p in ["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/2", fifo, tmp_path / "null-link"]:
        assert is_stream(p), p
    for p in [tmp_path / "f.csv", tmp_path, tmp_path / "missing", "/dev/shm/not-there.csv", "", "/dev"]:
        assert not is_stream(p), p
    assert atomic_write_bytes("/dev/null", b"gone") == Path("/dev/null")
    assert os.stat("/dev/null").st_size == 0 and sorted(x.name for x in tmp_path.iterdir()) == [
        "f.csv",
        "null-link",
        "pipe",
    ]


def test_streams_by_a_home_relative_name_and_what_is_no_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """is_stream and is_stdout read ``~`` as the home folder (one rule for both), and a value that is no path (a NUL
    byte, another type) is neither, never an error."""
    from tl_idempotence.core.files import is_stdout, is_stream

    monkeypatch.setenv("HOME", str(tmp_path))
    os.mkfifo(tmp_path / "pipe")
    out = tmp_path / "out.csv"
    assert is_stream("~/pipe") and not is_stream("~/out.csv")
    with _Fd1(out):
        assert is_stdout("~/out.csv") and not is_stdout("~/pipe")
        for bad in ["a\0b", 3, None]:
            assert not is_stream(bad) and not is_stdout(bad), bad


class _Fd1:
    """File descriptor 1 pointed at ``target`` (opened without O_APPEND, as a shell's ``>``) while the block runs,
    then back: what a redirected process sees, in this process."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __enter__(self) -> _Fd1:
        import sys

        sys.stdout.flush()
        self.saved = os.dup(1)
        fd = os.open(self.target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        os.dup2(self.saved, 1)
        os.close(self.saved)


def test_what_standard_output_is(tmp_path: Path):
    """is_stdout: by name, or the very file (or pipe) file descriptor 1 is; never another file, nor /dev/null."""
    from tl_idempotence.core.files import is_stdout

    out, other = tmp_path / "out.csv", tmp_path / "other.csv"
    other.write_text("x")
    os.symlink(out, tmp_path / "link.csv")
    with _Fd1(out):
        for p in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", out, tmp_path / "link.csv", str(out)]:
            assert is_stdout(p), p
        for p in [other, "/dev/stderr", "/dev/fd/2", "/dev/null", tmp_path, tmp_path / "missing", "", "-"]:
            assert not is_stdout(p), p
    with _Fd1(Path(os.devnull)):  # stdout discarded: writing /dev/null is not "data on stdout"
        assert not is_stdout("/dev/null") and is_stdout("/dev/stdout")
    r, w = os.pipe()
    try:
        saved = os.dup(1)
        os.dup2(w, 1)
        try:  # a pipe: only its names (the pipe has no path), or /dev/fd/N of a copy of fd 1
            assert is_stdout("/dev/stdout") and is_stdout(f"/dev/fd/{w}") and not is_stdout(out)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    finally:
        os.close(r)
        os.close(w)


def test_stdout_is_written_through_its_own_descriptor(tmp_path: Path):
    """atomic_write_bytes('/dev/stdout') into a redirected file keeps the order of what the process writes to
    stdout before and after (a second open of /dev/stdout, for appending, was overwritten by the next print)."""
    from tl_idempotence.core.files import atomic_write_bytes

    out = tmp_path / "out.txt"
    with _Fd1(out):
        os.write(1, b"before\n")
        assert atomic_write_bytes("/dev/stdout", b"label,P\nL0H0,0.5\n") == Path("/dev/stdout")
        os.write(1, b"after\n")
    assert out.read_bytes() == b"before\nlabel,P\nL0H0,0.5\nafter\n"
