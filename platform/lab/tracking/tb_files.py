"""What a TensorBoard event folder holds, checked record by record before it is
imported: how many files and records, and where a file is truncated or corrupt.

TensorBoard's own reader (``EventAccumulator``, tracking/tensorboard.py) stops at
the first bad record of a file and says nothing: a truncated, corrupt or random
file used to become a "succeeded" run with part of its points, or none. This
scan reads the files' framing (TFRecord: a little-endian uint64 length, the
masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data;
tensorflow/core/lib/io/record_writer.h) and reports each file's records and the
first problem, so an import ends ``failed`` or ``succeeded`` with the counts and
the reason. CRC-32C is TensorBoard's own pure-Python one (about 2.5 MB/s): the
scan runs in the import job on the control queue, not in a web request.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from pathlib import Path

EVENT_FILE_MARK = "tfevents"
# A record longer than this is not a TensorBoard event (a garbage length).
MAX_RECORD_BYTES = 256 * 1024 * 1024


@dataclass
class FileReport:
    file: str  # relative to the folder
    bytes: int
    records: int  # complete records whose CRCs match
    problem: str = ""  # "" = the whole file is sound
    incomplete_tail: bool = False  # only the last record is cut short (still being written?)

    def as_dict(self) -> dict:
        return asdict(self)


def event_files(folder: Path) -> list[Path]:
    """The event files under ``folder`` (and its subfolders: one per run of a writer)."""
    return sorted(p for p in folder.rglob(f"*{EVENT_FILE_MARK}*") if p.is_file())


def event_bytes(folder: Path) -> int:
    """Bytes of event files under ``folder`` (what an import reads)."""
    return sum(p.stat().st_size for p in event_files(folder))


def _masked_crc(data: bytes) -> int:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return masked_crc32c(data)


def scan_file(path: Path, folder: Path) -> FileReport:
    """Every record of one event file, checked; the first problem ends the scan."""
    report = FileReport(str(path.relative_to(folder)), path.stat().st_size, 0)
    offset = 0
    with path.open("rb") as f:
        while True:
            header = f.read(12)
            if not header:
                break
            if len(header) < 12:
                return _cut(report, offset)
            (length,) = struct.unpack("<Q", header[:8])
            (length_crc,) = struct.unpack("<I", header[8:])
            if _masked_crc(header[:8]) != length_crc or length > MAX_RECORD_BYTES:
                report.problem = f"not an event record at byte {offset} (its length check fails)"
                break
            body = f.read(length + 4)
            if len(body) < length + 4:
                return _cut(report, offset)
            (data_crc,) = struct.unpack("<I", body[length:])
            if _masked_crc(body[:length]) != data_crc:
                report.problem = f"record {report.records + 1} at byte {offset} is corrupt (CRC)"
                break
            report.records += 1
            offset += 12 + length + 4
    if not report.problem and report.records == 0:
        report.problem = "empty: no event record"
    return report


def _cut(report: FileReport, offset: int) -> FileReport:
    report.problem = f"truncated at byte {report.bytes}: the record at byte {offset} is incomplete"
    report.incomplete_tail = True
    return report


def scan_folder(folder: Path) -> list[FileReport]:
    return [scan_file(path, folder) for path in event_files(folder)]
