"""The errors tl_idempotence raises: one family, each with a documented cause and fix.

Every exception the library raises on purpose is a :class:`TLIError`. Each subclass
also derives from the built-in exception a caller would expect (``ValueError``,
``TypeError``, ``FileNotFoundError``, ``RuntimeError``), so ``except ValueError`` keeps
working. ``docs/errors.md`` lists each one with its cause and fix; every message names
what was wrong (the argument, the file, the tensor, the layer and head) and what to do.

This module imports nothing from the package (it is the bottom of every layer).
"""

from __future__ import annotations

__all__ = [
    "CacheError",
    "CheckpointError",
    "ChecksumError",
    "ClusterError",
    "DeviceError",
    "ItemError",
    "MissingExtraError",
    "MissingFileError",
    "OptionError",
    "OptionTypeError",
    "OutputOverInputError",
    "RegistrationError",
    "RegistryUnreachableError",
    "ReportFileError",
    "ReportMismatchError",
    "ResumeError",
    "TLIError",
    "UnknownModelError",
    "UnknownOptionError",
    "UnsupportedModelError",
    "WeightError",
    "ZooError",
]


class TLIError(Exception):
    """Base class of every error tl_idempotence raises on purpose."""


class OptionError(TLIError, ValueError):
    """An argument has a value outside its range (``threshold=1.5``, ``nulls=-1``, an unknown layer)."""


class OutputOverInputError(OptionError):
    """An output (a page, a CSV, a saved report, a resume or sweep folder) that is a file or folder the run
    reads: a checkpoint's file or folder, the zoo cache, a resume folder's parts, a saved report (names both)."""


class ReportMismatchError(OptionError):
    """A report taken for a model or a sweep item that it did not measure: another checkpoint, other weights
    (sha256 fingerprint), other sizes or options; the message names both sides."""


class RegistrationError(TLIError, ValueError):
    """An analysis registered with a name, option, head column or summary field that another analysis (or a report
    option) already has; the message names the name and both owners."""


class OptionTypeError(TLIError, TypeError):
    """An argument has the wrong type (``threshold="0.5"``, ``nulls=1.7``, ``compute_dtype=torch.int64``)."""


class UnknownOptionError(TLIError, TypeError):
    """A keyword argument no function of this route accepts (the message lists the closest valid names)."""


class UnsupportedModelError(TLIError, TypeError):
    """The object passed as a model is none of the supported kinds (the message lists them)."""


class WeightError(TLIError, ValueError):
    """Weights that have no closure: NaN/inf, integer, complex or mis-shaped O/V (names layer and head)."""


class CheckpointError(TLIError, ValueError):
    """A checkpoint file or directory that lies: corrupt, truncated, ambiguous or inconsistent (names the file)."""


class ReportFileError(CheckpointError):
    """A saved report folder whose files lie (changed, missing, another format); names the file."""


class MissingFileError(TLIError, FileNotFoundError):
    """A path that does not exist: a checkpoint, a shard an index points to, a source file (names it)."""


class ResumeError(TLIError, ValueError):
    """A resume directory that belongs to other options or is damaged beyond recomputation (names the file)."""


class DeviceError(TLIError, ValueError):
    """A device that is not there (``device="cuda"`` without CUDA) or not understood."""


class ItemError(TLIError, RuntimeError):
    """An item of a comparison or sweep whose own code failed (a callable that raised); names the item,
    the cause is chained."""


class ClusterError(TLIError, RuntimeError):
    """A Dask cluster that cannot run a sweep or trajectory: no worker left for the allowed time, a
    LocalCluster that could not start, a script that starts one without the ``__main__`` guard, a
    trajectory checkpoint whose worker kept dying (the message says which and what to do)."""


class MissingExtraError(TLIError, ImportError):
    """An entry point whose optional dependencies are not installed (a Dask sweep without ``dask`` and
    ``distributed``); the one-line message names the ``pip install "tl_idempotence[EXTRA]"`` that adds them."""


class ZooError(TLIError, RuntimeError):
    """A zoo model could not be made available (the message says why and what to do)."""


class UnknownModelError(ZooError, ValueError):
    """The name is not in the zoo (the message lists the known names)."""


class ChecksumError(ZooError):
    """A downloaded, supplied or cached file does not match its recorded sha256 (names the file)."""


class CacheError(ZooError):
    """The cache directory cannot be used (read-only, a file where a folder should be, ...)."""


class RegistryUnreachableError(ZooError):
    """``pip download`` failed (no network / index unreachable); the message names the file to fetch by hand."""
