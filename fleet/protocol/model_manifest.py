"""Model manifest: the model store's key layout, and the manifest whose presence marks a pushed model complete.

Key layout in the model bucket (``prefix`` is the stack's ``modelStore.prefix``, ``models`` by default)::

    <prefix>/<model id>/<revision>/files/<path>      one object per file of the model directory
    <prefix>/<model id>/<revision>/manifest.json     written after every file: a model without it is not there

The manifest lists every file with its size and sha256 (``{"format": 1, "model": ..., "revision": ...,
"files": [{"path": "config.json", "size": 663, "sha256": "..."}]}``). A pusher deletes an old manifest before it
overwrites files and writes the new one last, so a reader that sees a manifest sees a complete model; a reader
that raced a re-push gets a checksum mismatch, never a silently mixed model. Pure: no I/O but reading local files.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "MANIFEST_NAME",
    "PARTIAL_SUFFIX",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "ModelKeys",
    "scan_directory",
    "sha256_file",
]

MANIFEST_NAME = "manifest.json"
PARTIAL_SUFFIX = ".partial"  # a download in progress; no manifest file may end with it
_CHUNK = 1024 * 1024
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # one component of a model id, revision or key prefix
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """A manifest that cannot be read or is not well formed; the message names where it came from."""


class ManifestFile(BaseModel):
    """One file of the model: its path relative to the model directory (POSIX, no '..', no dotfiles)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int = Field(ge=0)
    sha256: str

    @field_validator("path")
    @classmethod
    def _relative_path(cls, value: str) -> str:
        parts = PurePosixPath(value).parts
        if not parts or value.startswith("/") or "\\" in value or any(p.startswith(".") for p in parts):
            raise ValueError(f"{value!r} is not a relative path without '..' or dotfile components")
        if str(PurePosixPath(*parts)) != value or value.endswith(PARTIAL_SUFFIX):
            raise ValueError(f"{value!r} is not a normalised path (or ends with {PARTIAL_SUFFIX!r})")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError(f"{value!r} is not a sha256 hex digest (64 lowercase hex digits)")
        return value


class Manifest(BaseModel):
    """Every file of one model revision; equal manifests describe byte-identical models."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal[1] = 1
    model: str
    revision: str
    files: list[ManifestFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_paths(self) -> Manifest:
        paths = [f.path for f in self.files]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise ValueError(f"files listed twice: {', '.join(duplicates)}")
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def parse(cls, data: bytes, source: str) -> Manifest:
        """The manifest in ``data``; ManifestError naming ``source`` (a key or a path) and the first problem."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "document"
            raise ManifestError(f"{source}: invalid manifest at {where}: {error['msg']}") from None


@dataclass(frozen=True)
class ModelKeys:
    """Where one model revision lives in the bucket; ValueError for ids that cannot be keys."""

    prefix: str
    model: str
    revision: str

    def __post_init__(self) -> None:
        for what, value in (("key prefix", self.prefix), ("model id", self.model)):
            if not all(_SEGMENT.match(part) for part in value.split("/")):
                raise ValueError(f"{what} {value!r} must be '/'-separated names of letters, digits, '.', '_', '-'")
        if not _SEGMENT.match(self.revision):
            raise ValueError(f"revision {self.revision!r} must be letters, digits, '.', '_', '-'")

    @property
    def root(self) -> str:
        return f"{self.prefix}/{self.model}/{self.revision}"

    @property
    def manifest(self) -> str:
        return f"{self.root}/{MANIFEST_NAME}"

    def file(self, path: str) -> str:
        return f"{self.root}/files/{path}"


def sha256_file(path: Path, start: hashlib._Hash | None = None, offset: int = 0) -> hashlib._Hash:
    """The sha256 of ``path`` from byte ``offset`` on, continuing ``start`` (a resumed download's running hash)."""
    digest = start if start is not None else hashlib.sha256()
    with path.open("rb") as handle:
        handle.seek(offset)
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest


def scan_directory(root: Path, model: str, revision: str) -> Manifest:
    """The manifest of every regular file under ``root`` (symlinks followed, as in a Hub snapshot folder).

    Dotfiles and dot-folders (``.cache/``, ``.git/``) are skipped: they are tool state, not model files.
    ManifestError when ``root`` holds no model file.
    """
    files = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        files.append(
            ManifestFile(path=relative.as_posix(), size=path.stat().st_size, sha256=sha256_file(path).hexdigest())
        )
    if not files:
        raise ManifestError(f"{root}: no model files to push")
    return Manifest(model=model, revision=revision, files=files)
