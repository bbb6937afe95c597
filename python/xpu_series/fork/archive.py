"""A deterministic zip writer for wheels: one fixed date, fixed modes, the source's
members copied as they are compressed, new content stored."""

# Recompressing would make the bytes depend on the zlib that runs (zlib-ng, for one,
# compresses differently) and costs seconds per wheel; copying the source's
# compressed stream and storing our few files uncompressed depends on neither.

from __future__ import annotations

import struct
import time
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from xpu_series.errors import WheelError

_LOCAL = struct.Struct("<4s5H3L2H")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_END = struct.Struct("<4s4H2LH")
_VERSION = 20  # 2.0: deflate, folders; nothing newer is used
_MADE_BY = (3 << 8) | _VERSION  # Unix, so external_attr carries the file mode
_UTF8 = 0x800
_LIMIT = 0xFFFFFFFF  # no zip64: a wheel that needs it is refused, not guessed at


@dataclass(frozen=True)
class Member:
    """One zip entry as it is written: name, mode and the stored payload."""

    name: str
    executable: bool
    method: int
    crc: int
    size: int
    payload: bytes


def stored(name: str, data: bytes, executable: bool = False) -> Member:
    """New content, stored uncompressed."""
    return Member(
        name, executable, zipfile.ZIP_STORED, zlib.crc32(data), len(data), data
    )


def copied(source: BinaryIO, info: zipfile.ZipInfo, name: str) -> Member:
    """A member of an open source zip, its compressed bytes copied as they are."""
    if info.flag_bits & 0x1 or info.compress_type not in (
        zipfile.ZIP_STORED,
        zipfile.ZIP_DEFLATED,
    ):
        raise WheelError(
            f"{info.filename} is encrypted or compressed with method "
            f"{info.compress_type}: not a wheel pip could install",
            hint="this wheel was not built by upstream; do not use it",
        )
    source.seek(info.header_offset)
    head = source.read(_LOCAL.size)
    if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
        raise WheelError(f"{info.filename}: no local header where the index says")
    name_len, extra_len = _LOCAL.unpack(head)[-2:]
    source.seek(info.header_offset + _LOCAL.size + name_len + extra_len)
    payload = source.read(info.compress_size)
    if len(payload) != info.compress_size:
        raise WheelError(f"{info.filename} is truncated")
    return Member(
        name,
        bool((info.external_attr >> 16) & 0o111),
        info.compress_type,
        info.CRC,
        info.file_size,
        payload,
    )


def dos_datetime(epoch: int) -> tuple[int, int]:
    """(time, date) fields of a zip entry for `epoch` in UTC; the format starts
    in 1980, so earlier dates are 1980-01-01.

    >>> dos_datetime(0) == dos_datetime(315532800) == (0, (0 << 9) | (1 << 5) | 1)
    True
    """
    t = time.gmtime(max(epoch, 315532800))
    return (
        (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
        ((t.tm_year - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday,
    )


def write_zip(out: BinaryIO, members: Iterable[Member], epoch: int) -> None:
    """Write `members` in the order given, every entry dated `epoch`, mode 0644 or
    0755, no extra fields, no comment."""
    dtime, ddate = dos_datetime(epoch)
    central: list[bytes] = []
    offset = 0
    for member in members:
        name = member.name.encode("utf-8")
        flags = 0 if member.name.isascii() else _UTF8
        if max(offset, len(member.payload), member.size) > _LIMIT:
            raise WheelError(f"{member.name}: the wheel would need zip64")
        head = _LOCAL.pack(
            b"PK\x03\x04", _VERSION, flags, member.method, dtime, ddate,
            member.crc, len(member.payload), member.size, len(name), 0,
        )  # fmt: skip
        out.write(head + name)
        out.write(member.payload)
        mode = 0o100755 if member.executable else 0o100644
        central.append(
            _CENTRAL.pack(
                b"PK\x01\x02",
                _MADE_BY,
                _VERSION,
                flags,
                member.method,
                dtime,
                ddate,
                member.crc,
                len(member.payload),
                member.size,
                len(name),
                0,
                0,
                0,
                0,
                mode << 16,
                offset,
            )  # fmt: skip
            + name
        )
        offset += len(head) + len(name) + len(member.payload)
    start = offset
    for entry in central:
        out.write(entry)
        offset += len(entry)
    if len(central) > 0xFFFF or offset > _LIMIT:
        raise WheelError("the wheel would need zip64 (too many or too large files)")
    out.write(
        _END.pack(
            b"PK\x05\x06", 0, 0, len(central), len(central), offset - start, start, 0
        )
    )
