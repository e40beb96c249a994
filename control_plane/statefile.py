"""Statefile: small JSON documents a control plane keeps across its own restarts, written atomically.

    write_json(path, doc)   temp file in the same folder -> fsync -> rename over ``path`` -> fsync the folder
    read_json(path)         the document, None when there is no file; StateFileError when it cannot be read

A reader (the next control plane, after a crash at any instant) finds either the previous document or the new
one, never a mix: a rename within one file system is atomic. The files are the control plane's alone (one
control plane per fleet), so there is no locking between writers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["StateFileError", "read_json", "write_json"]


class StateFileError(RuntimeError):
    """A state file exists but cannot be read or parsed, or cannot be written (the path is in the message)."""


def write_json(path: Path, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as JSON, atomically and durably (see the module docstring)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut
        finally:
            os.close(folder)
    except OSError as exc:
        raise StateFileError(f"cannot write {path}: {exc}") from exc


def read_json(path: Path) -> Any:
    """The JSON document at ``path``; None when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"cannot read {path}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"{path} is not JSON ({exc}); move it away to start without it") from exc
