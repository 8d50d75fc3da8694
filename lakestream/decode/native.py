"""The native parser of Debezium payloads: a run of schemas-on envelopes into the Arrow columns the run decoder reads.

Arrow's JSON reader spends about 8 µs on each 760-byte payload of a full-row update; the Rust library of
``payloads_rs/`` (no dependencies, a C ABI, loaded with ctypes) parses the same payloads into the same columns in a
fraction of that, and checks the envelopes' schema parts on the way. It is built by ``make setup``
(``python -m lakestream.decode.native``) with cargo into the cache beside the compiled JVM helpers, under a digest of
its sources, so a changed source is never run from a stale library.

Like the run decoder it serves, it never judges a record: anything it does not take as it is makes `parse_envelopes`
return None, and the run is decoded record by record. Without the library (not built, or an executor of a cluster
that has no cache: ``LAKESTREAM_NATIVE_LIB`` names a copy) the run decoder uses Arrow's reader; ``LAKESTREAM_NATIVE=0``
chooses that too (the A/B of the two).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)
_CRATE = Path(__file__).resolve().parent / "payloads_rs"
_KINDS = {pa.int64(): 0, pa.float64(): 1, pa.bool_(): 2, pa.string(): 3}


class _Column(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("valid", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("capacity", ctypes.c_int64),
        ("used", ctypes.c_int64),
    ]


class _Envelope(ctypes.Structure):
    _fields_ = [
        ("after_valid", ctypes.c_void_p),
        ("before_valid", ctypes.c_void_p),
        ("op", ctypes.c_void_p),
        ("source_valid", ctypes.c_void_p),
        ("source_ts", ctypes.c_void_p),
        ("source_ts_valid", ctypes.c_void_p),
        ("ts_ms", ctypes.c_void_p),
        ("ts_ms_valid", ctypes.c_void_p),
    ]


def _digest() -> str:
    parts = [_CRATE / "Cargo.toml", *sorted((_CRATE / "src").glob("*.rs"))]
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in parts)).hexdigest()[:12]


def library_path() -> Path:
    """Where the library of the current sources is (or would be) built."""
    from lakestream.runtime.jvm_jars import cache_dir

    return cache_dir() / f"lakestream-payloads-{_digest()}.so"


def build() -> Path:
    """The library of the current sources, built with cargo unless already there."""
    target = library_path()
    if target.exists():
        return target
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    build_dir = target.parent / "payloads-target"
    subprocess.run(
        [cargo, "build", "--release", "--offline", "--quiet", "--manifest-path", str(_CRATE / "Cargo.toml")],
        check=True,
        env={**os.environ, "CARGO_TARGET_DIR": str(build_dir)},
    )
    built = build_dir / "release" / "liblakestream_payloads.so"
    partial = target.with_suffix(f".{os.getpid()}.partial")
    shutil.copyfile(built, partial)
    partial.replace(target)  # atomic: a process loading it never sees half a library
    return target


@cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("LAKESTREAM_NATIVE", "1") == "0":
        return None
    path = Path(os.environ["LAKESTREAM_NATIVE_LIB"]) if "LAKESTREAM_NATIVE_LIB" in os.environ else library_path()
    if not path.exists():
        log.warning(
            "the native payload parser is not built (%s): Arrow's JSON reader parses the runs, 2-3x slower; "
            "`python -m lakestream.decode.native` builds it (make setup does)",
            path,
        )
        return None
    try:
        lib = ctypes.PyDLL(str(path))  # not CDLL: the library reads the Python lists it is given, holding the GIL
        parse, keys = lib.lakestream_parse_envelopes, lib.lakestream_keys_share_head
    except (OSError, AttributeError) as e:  # not a library of this machine, or not this one
        log.warning("the native payload parser at %s does not load (%s): Arrow's JSON reader parses the runs", path, e)
        return None
    parse.restype = ctypes.c_int32
    parse.argtypes = [
        ctypes.py_object,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.POINTER(_Column),
        ctypes.POINTER(_Column),
        ctypes.POINTER(_Envelope),
        ctypes.POINTER(ctypes.c_int64),
    ]
    keys.restype = ctypes.c_int32
    keys.argtypes = [ctypes.py_object, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def available() -> bool:
    """Whether runs are parsed here (the library is built and not switched off)."""
    return _library() is not None


@dataclass
class _Buffers:
    """One side's column of one field: the numpy arrays the library fills."""

    kind: int
    valid: np.ndarray
    values: np.ndarray
    data: np.ndarray | None

    def struct(self) -> _Column:
        data = self.data
        return _Column(
            self.kind,
            self.valid.ctypes.data,
            self.values.ctypes.data,
            0 if data is None else data.ctypes.data,
            0 if data is None else len(data),
            0,
        )

    def array(self, wire: pa.DataType, n: int, column: _Column) -> pa.Array:
        valid = None if self.valid.all() else pa.py_buffer(np.packbits(self.valid, bitorder="little"))
        if self.kind == 3:
            assert self.data is not None
            data = pa.py_buffer(self.data[: column.used])
            return pa.Array.from_buffers(wire, n, [valid, pa.py_buffer(self.values), data])
        if self.kind == 2:
            return pa.Array.from_buffers(wire, n, [valid, pa.py_buffer(np.packbits(self.values, bitorder="little"))])
        return pa.Array.from_buffers(wire, n, [valid, pa.py_buffer(self.values)])


def _buffers(wire: pa.DataType, n: int, capacity: int) -> _Buffers:
    kind = _KINDS[wire]
    valid = np.zeros(n, np.uint8)
    if kind == 3:
        return _Buffers(kind, valid, np.zeros(n + 1, np.int32), np.empty(capacity, np.uint8))
    values = np.zeros(n, np.uint8 if kind == 2 else np.int64 if kind == 0 else np.float64)
    return _Buffers(kind, valid, values, None)


def keys_share_head(keys: list[bytes | None], head: bytes) -> bool | None:
    """Whether every key is ``bytes`` that starts with ``head`` and, past trailing whitespace, ends with ``}``; None
    without the library."""
    lib = _library()
    if lib is None:
        return None
    return bool(lib.lakestream_keys_share_head(keys, head, len(head)))


def _mask(valid: np.ndarray) -> pa.Array:
    return pa.array(valid == 0)


def parse_envelopes(
    values: list[bytes], prefix_len: int, fields: list[tuple[str, pa.DataType]], key_columns: list[str]
) -> pa.Table | None:
    """The payloads of ``values`` (schemas-on envelopes; each payload starts ``prefix_len`` bytes in, after the first
    value's schema part, which every value must carry byte for byte, and ends one byte before the value's end) as
    the table Arrow's JSON reader would give for the schema ``before`` (the key columns), ``after`` (``fields``),
    ``op``, ``source`` (``ts_ms``), ``ts_ms``; None when a value is not taken as it is (or the library is absent)."""
    lib = _library()
    if lib is None or not values:
        return None
    n = len(values)
    capacity = sum(map(len, values)) + 1  # no column's strings are longer than the payloads that hold them
    names = [name.encode() for name, _ in fields]
    name_offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(x) for x in names], out=name_offsets[1:])
    name_bytes = b"".join(names)
    keys = set(key_columns)
    after = [_buffers(wire, n, capacity) for _, wire in fields]
    before = [_buffers(wire, n, capacity) if name in keys else None for name, wire in fields]
    after_structs = (_Column * len(fields))(*[b.struct() for b in after])
    before_structs = (_Column * len(fields))(
        *[
            b.struct() if b is not None else _Column(_KINDS[w], 0, 0, 0, 0, 0)
            for b, (_, w) in zip(before, fields, strict=True)
        ]
    )
    after_valid, before_valid, op = np.zeros(n, np.uint8), np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    source_valid, source_ts, source_ts_valid = np.zeros(n, np.uint8), np.zeros(n, np.int64), np.zeros(n, np.uint8)
    ts_ms, ts_ms_valid = np.zeros(n, np.int64), np.zeros(n, np.uint8)
    envelope = _Envelope(
        after_valid.ctypes.data,
        before_valid.ctypes.data,
        op.ctypes.data,
        source_valid.ctypes.data,
        source_ts.ctypes.data,
        source_ts_valid.ctypes.data,
        ts_ms.ctypes.data,
        ts_ms_valid.ctypes.data,
    )
    failed = ctypes.c_int64(-1)
    code = lib.lakestream_parse_envelopes(
        values,
        prefix_len,
        name_bytes,
        name_offsets.ctypes.data,
        len(fields),
        after_structs,
        before_structs,
        ctypes.byref(envelope),
        ctypes.byref(failed),
    )
    if code != 0:
        return None
    after_row = pa.struct([(name, wire) for name, wire in fields])
    before_row = pa.struct([(name, wire) for name, wire in fields if name in keys])
    after_children = [b.array(w, n, after_structs[i]) for i, (b, (_, w)) in enumerate(zip(after, fields, strict=True))]
    before_children = [
        b.array(w, n, before_structs[i])
        for i, (b, (_, w)) in enumerate(zip(before, fields, strict=True))
        if b is not None
    ]
    ops = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(op)]
    )
    columns = [
        pa.StructArray.from_arrays(before_children, fields=list(before_row), mask=_mask(before_valid)),
        pa.StructArray.from_arrays(after_children, fields=list(after_row), mask=_mask(after_valid)),
        ops,
        pa.StructArray.from_arrays(
            [_Buffers(0, source_ts_valid, source_ts, None).array(pa.int64(), n, _Column())],
            fields=[pa.field("ts_ms", pa.int64())],
            mask=_mask(source_valid),
        ),
        _Buffers(0, ts_ms_valid, ts_ms, None).array(pa.int64(), n, _Column()),
    ]
    return pa.Table.from_arrays(columns, names=["before", "after", "op", "source", "ts_ms"])


if __name__ == "__main__":
    try:
        print(build())
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"the native payload parser did not build ({e}); `cargo` (rustup) is needed: see docs/stack.md")
