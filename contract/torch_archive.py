"""Declared sizes of a torch archive (``model.pt``, ``checkpoint.pt``), checked before torch loads it (issue 24).

``torch.load`` trusts the archive: a few-KB ``model.pt`` whose tensors have stride 0 can declare a
320 → 3,000,000 → 3 network over a one-value storage, and rebuilding that network allocates gigabytes;
a deflated member can expand without bound. :func:`check_archive` reads only the zip directory and the
small ``data.pkl`` (with an unpickler that calls nothing: every global becomes an inert record) and
refuses, naming the file:

* a member compressed more than ``MAX_RATIO`` to 1 (torch stores members uncompressed), or members whose
  expanded total exceeds the memory available (``ldpfl.contract.memory``);
* a storage whose member holds fewer bytes than the storage declares;
* a tensor that reaches past its storage (offset and strides), or that declares more values than its
  storage holds (stride-0 tricks: a saved parameter is dense);
* a total of declared values (as float32, counted ``COPIES`` times: the state, the model, one conversion)
  that does not fit in the memory available.

No torch import: the checks run before torch sees the file.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpfl.contract.memory import format_bytes, memory_shortfall
from ldpfl.contract.schema import FormatError
from ldpfl.contract.small_files import SmallFileError, check_regular

MAX_RATIO = 200
"""Largest expansion of a compressed member (deflate of real float weights is far below this)."""
MAX_PICKLE_BYTES = 64 << 20
COPIES = 3
_ELEMENT_BYTES = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                  "Byte": 1, "Bool": 1, "ComplexDouble": 16, "ComplexFloat": 8}


@dataclass
class _Global:
    """An inert stand-in for a global the pickle names (module and name only)."""

    module: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.module == "torch._utils" and self.name == "_rebuild_tensor_v2" and len(args) >= 4:
            return _Tensor(*args[:4])
        if self.module == "torch._utils" and self.name == "_rebuild_parameter" and args:
            return args[0]
        if (self.module, self.name) in (("collections", "OrderedDict"), ("builtins", "dict")):
            return {}
        return _Opaque()


class _Opaque:
    """Any other object the pickle builds: it accepts state and items and means nothing."""

    def __setstate__(self, state: Any) -> None:
        del state

    def __setitem__(self, key: Any, value: Any) -> None:
        del key, value

    def append(self, value: Any) -> None:
        """Accept a list item (APPEND)."""
        del value

    def extend(self, values: Any) -> None:
        """Accept list items (APPENDS)."""
        del values


@dataclass(frozen=True)
class _Storage:
    key: str
    element_bytes: int
    numel: int


@dataclass
class _Tensor:
    storage: Any
    offset: Any
    size: Any
    stride: Any

    def __setstate__(self, state: Any) -> None:
        del state


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {str(pid)[:60]}")
        _, kind, key, _location, numel = pid
        if not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"storage {key!r} declares {numel!r} values")
        name = kind.name if isinstance(kind, _Global) else ""
        element = _ELEMENT_BYTES.get(name.removesuffix("Storage"), 1)  # UntypedStorage: bytes
        return _Storage(str(key), element, numel)


@dataclass(frozen=True)
class ArchiveSizes:
    """What :func:`check_archive` found: tensors, declared values and stored bytes."""

    tensors: int
    values: int
    stored_bytes: int


def _tensors(value: Any, found: list[_Tensor], depth: int = 0) -> None:
    if depth > 50:
        return
    if isinstance(value, _Tensor):
        found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _tensors(item, found, depth + 1)


def _ints(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, tuple | list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def check_archive(path: str | os.PathLike[str], what: str = "model") -> ArchiveSizes:
    """Refuse an archive whose declared sizes do not fit its bytes or the memory available (module docstring).

    Raises
    ------
    FormatError
        Naming the file and the member or tensor that is wrong; nothing large has been allocated.
    """
    path = Path(path)
    try:
        check_regular(path, what)
    except SmallFileError as error:
        raise FormatError(path, str(error).removeprefix(f"{path}: ")) from None
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise FormatError(path, f"not a {what} saved by ldpfl federate (not a torch zip archive: {error})") from None
    with archive:
        members = archive.infolist()
        expanded = sum(m.file_size for m in members)
        for member in members:
            if member.compress_type != zipfile.ZIP_STORED and member.file_size > MAX_RATIO * member.compress_size \
                    + (1 << 20):
                raise FormatError(path, f"member {member.filename[:80]!r} expands from {member.compress_size} to "
                                        f"{member.file_size} bytes (a zip bomb?); not a {what} of ldpfl federate")
        shortfall = memory_shortfall(expanded)
        if shortfall is not None:
            raise FormatError(path, f"its members expand to {format_bytes(expanded)}: reading it {shortfall}")
        pickles = [m for m in members if m.filename.endswith("/data.pkl") or m.filename == "data.pkl"]
        if len(pickles) != 1 or pickles[0].file_size > MAX_PICKLE_BYTES:
            raise FormatError(path, f"not a {what} saved by ldpfl federate (no single data.pkl of at most "
                                    f"{format_bytes(MAX_PICKLE_BYTES)})")
        prefix = pickles[0].filename.removesuffix("data.pkl")
        sizes = {m.filename.removeprefix(prefix + "data/"): m.file_size for m in members
                 if m.filename.startswith(prefix + "data/")}
        raw = archive.read(pickles[0])
    try:
        payload = _Unpickler(io.BytesIO(raw)).load()
    except Exception as error:  # noqa: BLE001 - a crafted pickle raises anything; torch would refuse it too
        raise FormatError(path, f"not a {what} saved by ldpfl federate (its data.pkl: {type(error).__name__}: "
                                f"{' '.join(str(error).split())[:120]})") from None
    found: list[_Tensor] = []
    _tensors(payload, found)
    values = 0
    for number, tensor in enumerate(found):
        storage = tensor.storage
        size, stride, offset = _ints(tensor.size), _ints(tensor.stride), tensor.offset
        label = f"tensor {number}"
        if not isinstance(storage, _Storage) or size is None or stride is None or len(size) != len(stride) \
                or not isinstance(offset, int) or offset < 0 or any(s < 0 for s in size + stride):
            raise FormatError(path, f"{label} has a malformed declaration; not a {what} of ldpfl federate")
        stored = sizes.get(storage.key)
        if stored is None or stored < storage.numel * storage.element_bytes:
            raise FormatError(path, f"{label}: its storage {storage.key!r} declares {storage.numel} values but the "
                                    f"archive holds {stored or 0} bytes for it")
        count = math.prod(size)
        extent = 0 if count == 0 else offset + 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))
        if extent > storage.numel or count > storage.numel:
            raise FormatError(path, f"{label} declares shape {list(size)} ({count} values) over a storage of "
                                    f"{storage.numel} values (strides {list(stride)}); a saved {what} stores "
                                    "every value")
        values += count
    needed = COPIES * 4 * values
    shortfall = memory_shortfall(needed)
    if shortfall is not None:
        raise FormatError(path, f"its {values} parameters: building the model {shortfall}")
    return ArchiveSizes(len(found), values, expanded)


__all__ = ["COPIES", "MAX_RATIO", "ArchiveSizes", "check_archive"]
