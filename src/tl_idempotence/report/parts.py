"""One layer's finished report rows, and the resume directory that keeps them on disk.

A :class:`LayerPart` is everything the report loop keeps of a layer: its per-head rows,
its layer row, its long tables, and what it was computed from (the layer's weight
fingerprint and the options key). :class:`ResumeDir` writes each part as parquet tables
plus one JSON record (no pickle: a file from a directory is never executed) and hands a
part back only when its record says it was computed from the *same* weights (the
layer's sha256 fingerprint) with the *same* options by the *same* package version and code
(:func:`~tl_idempotence.core.files.package_code_sha256`), and the record and its tables are intact
(sha256); otherwise the layer is recomputed.

Layout of a resume directory::

    manifest.json                 format, the options key, the model's sizes and name
    layer_00003.json              the part record (written last): layer, fingerprint,
                                  options key, layer row, notes, the sha256 of every
                                  table file of the part, and the sha256 ``digest`` of the
                                  record itself (so an edited number is detected)
    layer_00003.heads.parquet     per-head rows
    layer_00003.<table>.parquet   the analyses' long tables (scramble draws, ...)

Every file is written atomically (temp file + ``os.replace``); stray ``*.tmp<pid>``
files from a killed run are ignored and removed when the directory is next opened.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
from pathlib import Path
from typing import Any

import pandas as pd

from ..analyses.loop import LayerPart
from ..analyses.report_options import ReportOptions, with_absent
from ..core.files import (
    atomic_write_bytes,
    atomic_write_text,
    package_code_sha256,
    read_json,
    record_digest,
    sha256_bytes,
    sha256_file,
)
from ..core.heads import ModelInfo
from ..core.jsonio import RECORD, json_ready, json_restore, json_text
from ..core.kwargs import warn_at_caller
from ..errors import OptionTypeError, ResumeError

__all__ = ["FORMAT", "LayerPart", "ResumeDir", "json_restore", "json_safe"]

FORMAT = "tl_idempotence.resume/2"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("tl_idempotence")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return None


#: The package version a part was computed by (parts of another version are recomputed: the maths may differ).
_VERSION = _package_version()


def json_safe(x: Any) -> Any:
    """``x`` as strict JSON under the record policy (:data:`~tl_idempotence.core.jsonio.RECORD`): numpy scalars
    as Python scalars, NaN/inf as the strings "NaN"/"Infinity"/"-Infinity"; :func:`json_restore` undoes it."""
    return json_ready(x, RECORD)


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


class ResumeDir:
    """Per-layer parts of an interruptible report (``idempotence_report(..., resume=dir)``).

    Args:
        path: the directory (created).
        options: the report's validated options (their :meth:`~ReportOptions.key` must match
            the manifest's).
        info: the model's description (recorded in a new manifest).

    Raises:
        ResumeError: the directory's manifest was written for other options (names them), or
            the manifest is unreadable (names the file); a path that is a file; an unwritable
            directory. OptionTypeError: ``path`` is not a ``str`` / ``os.PathLike`` (nothing is made).
    """

    def __init__(self, path: str | os.PathLike[str], options: ReportOptions, info: ModelInfo) -> None:
        if not isinstance(path, (str, os.PathLike)):  # every route checks first; here too, never a raw TypeError
            raise OptionTypeError(f"resume must be a folder path; got {type(path).__name__}.")
        self.dir = Path(path).expanduser()
        if self.dir.exists() and not self.dir.is_dir():
            raise ResumeError(f"resume={str(path)!r} is a file, not a directory.")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ResumeError(f"Cannot create the resume directory {self.dir}: {e.strerror or e}.") from e
        self.key = options.key()
        # Temp files of a killed writer: only this directory's own names (never a user's other files).
        for pattern in ("layer_*.tmp[0-9]*", "manifest.json.tmp[0-9]*"):
            for stale in self.dir.glob(pattern):
                if stale.is_file():
                    stale.unlink(missing_ok=True)
        manifest = {
            "format": FORMAT,
            "options": self.key,
            "model": {
                "model_name": info.model_name,
                "n_layers": info.n_layers,
                "n_heads": info.n_heads,
                "n_kv_heads": info.n_kv_heads,
                "d_model": info.d_model,
                "d_head": info.d_head,
            },
        }
        mfile = self.dir / "manifest.json"
        if mfile.exists():
            old = read_json(mfile, ResumeError, "resume manifest")
            if not isinstance(old, dict) or old.get("format") != FORMAT:
                fmt = old.get("format") if isinstance(old, dict) else type(old).__name__
                raise ResumeError(
                    f"{mfile} is not a {FORMAT} manifest (format {fmt!r}): this directory was written by another "
                    "version or program. Use a new directory, or delete this one to start over."
                )
            oldopt = old.get("options", {})
            if isinstance(oldopt, dict):  # an option declared after the manifest was written means its absent value
                oldopt = with_absent(oldopt)
            diff = [
                f"options.{k}: {oldopt.get(k)!r} -> {self.key.get(k)!r}"
                for k in sorted(set(oldopt) | set(self.key))
                if oldopt.get(k) != self.key.get(k)
            ]
            if diff:
                raise ResumeError(
                    f"Cannot resume in {self.dir}: its parts were made with different options ({'; '.join(diff)}). "
                    "Use a new directory, or delete this one to start over."
                )
        else:
            try:
                atomic_write_text(mfile, json_text(manifest, RECORD, indent=2, sort_keys=True))
            except OSError as e:
                raise ResumeError(f"Cannot write {mfile}: {e.strerror or e}. Is the directory writable?") from e

    def _record(self, layer: int) -> Path:
        return self.dir / f"layer_{int(layer):05d}.json"

    def _table_file(self, layer: int, name: str) -> Path:
        return self.dir / f"layer_{int(layer):05d}.{name}.parquet"

    def load(self, layer: int, fingerprint: str) -> LayerPart | None:
        """The stored part of ``layer`` when it was made from these weights with these options, else None.

        A part that is missing returns None silently; one that belongs to other weights,
        other options or another layer, or whose files are damaged, returns None with a
        ``UserWarning`` naming the file and why (the layer is then recomputed and overwritten).
        """
        rec_file = self._record(layer)
        if not rec_file.exists():
            return None

        def stale(why: str) -> None:
            why = why.rstrip(".")  # a reason that is a sentence (a read error) ends where this one goes on
            warn_at_caller(f"Resume part {rec_file}: {why}; recomputing layer {layer}.", UserWarning)

        try:
            rec = read_json(rec_file, ResumeError, "resume part")
        except ResumeError as e:
            stale(str(e))
            return None
        if not isinstance(rec, dict) or rec.get("format") != FORMAT:
            stale("not a part record of this format")
            return None
        if rec.get("digest") != record_digest(rec):
            stale("its record does not match its recorded sha256 digest (edited or damaged)")
            return None
        if rec.get("layer") != int(layer):
            stale(f"it records layer {rec.get('layer')!r} (a part copied from another layer)")
            return None
        if rec.get("options") != self.key:
            stale("it was made with other options")
            return None
        if rec.get("version") != _VERSION:
            stale(f"it was made by tl_idempotence {rec.get('version')!r}, this is {_VERSION!r}")
            return None
        if rec.get("code") != package_code_sha256():
            stale("it was made by other code of tl_idempotence (the package's code sha256 differs)")
            return None
        if rec.get("fingerprint") != fingerprint:
            stale("the layer's weights changed since it was written (sha256 fingerprint differs)")
            return None
        tables: dict[str, pd.DataFrame] = {}
        files = rec.get("files")
        if not isinstance(files, dict) or "heads" not in files:
            stale("its record lists no table files")
            return None
        for name, digest in files.items():
            f = self._table_file(layer, name)
            try:
                if sha256_file(f) != digest:
                    stale(f"{f.name} does not match its recorded sha256 (changed or damaged)")
                    return None
                tables[name] = pd.read_parquet(f)
            except OSError as e:
                stale(f"{f.name} cannot be read ({e.strerror or e})")
                return None
            except Exception as e:  # noqa: BLE001 - a damaged parquet file: recompute, naming it
                stale(f"{f.name} is not a readable parquet file ({type(e).__name__})")
                return None
        heads = tables.pop("heads")
        row = json_restore(rec.get("row"))
        keys = rec.get("row_keys")
        # every layer has a row (at least the closure's values): a part without one is not a finished layer
        if not isinstance(row, dict) or not row or not isinstance(keys, list) or sorted(keys) != sorted(row):
            stale("its layer row is malformed")
            return None
        row = {k: row[k] for k in keys}  # the column order of a fresh run (JSON keys are sorted)
        return LayerPart(layer=int(layer), fingerprint=fingerprint, heads=heads, row=row, tables=tables)

    def save(self, part: LayerPart) -> None:
        """Write ``part`` (tables first, the record last; each atomically).

        Raises:
            ResumeError: the directory cannot be written (disk full, read-only).
        """
        files: dict[str, str] = {}
        try:
            for name, df in {"heads": part.heads, **part.tables}.items():
                data = _parquet_bytes(df)
                atomic_write_bytes(self._table_file(part.layer, name), data)
                files[name] = sha256_bytes(data)
            rec = {
                "format": FORMAT,
                "layer": int(part.layer),
                "fingerprint": part.fingerprint,
                "options": self.key,
                "version": _VERSION,
                "code": package_code_sha256(),
                "row": json_safe(part.row),
                "row_keys": [str(k) for k in part.row],
                "files": files,
            }
            rec["digest"] = record_digest(rec)
            atomic_write_text(self._record(part.layer), json_text(rec, RECORD, indent=1, sort_keys=True))
        except OSError as e:
            where = Path(e.filename).name if getattr(e, "filename", None) else self.dir
            if getattr(e, "filename2", None):
                where = Path(e.filename2).name
            raise ResumeError(
                f"Cannot write resume part of layer {part.layer} in {self.dir} ({where}): {e.strerror or e}. "
                "Is the directory writable, and is that name a file?"
            ) from e
