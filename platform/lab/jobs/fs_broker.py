"""The embedded broker: kombu's filesystem transport, with whole messages only.

kombu's stock filesystem channel creates a message file and then writes into
it, under an advisory lock that its reader never takes. A consumer polling
the folder in between moves the still-empty file away, fails to decode it and
stops the worker ("Unrecoverable error: JSONDecodeError"). On a busy machine
that window is hit: a reconciler died this way while a worker was being
killed and restarted.

This channel writes each message to a hidden temporary name in the same folder
and renames it into place (`os.replace` is atomic within one filesystem), so a
reader sees either no message or the whole of it. A reader claims a message by
renaming it to a hidden name in the same folder, so that of several consumers
polling one queue exactly one gets it. A reader that still finds a
message it cannot decode (written by an older producer, or a truncated disk)
sets it aside under ``<processed>/rejected/`` and goes on: the database is the
state of record and a message is only a wake-up (docs/design.md, "processes"),
so dropping one loses no run.

Importing this module points kombu's ``filesystem://`` scheme at this
transport, for producers (the web process) and consumers (workers) alike.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

REJECTED_FOLDER = "rejected"


def message_filename(queue: str) -> str:
    """``<ms>_<uuid>.<queue>.msg``, the name stock readers also recognise. The
    milliseconds are zero-padded so that sorting the names sorts by arrival."""
    return f"{round(time.monotonic() * 1000):015d}_{uuid.uuid4()}.{queue}.msg"


def is_message_of(filename: str, queue: str) -> bool:
    """True for a whole message of ``queue``; temporary files start with "."."""
    return not filename.startswith(".") and filename.partition(".")[2] == f"{queue}.msg"


def write_atomically(folder: str | os.PathLike, filename: str, data: bytes) -> None:
    """Write ``data`` to ``folder/filename`` so that no reader sees a part of it."""
    folder = Path(folder)
    part = folder / f".{uuid.uuid4().hex}.part"
    try:
        with open(part, "wb") as f:
            f.write(data)
        os.replace(part, folder / filename)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ChannelError(f"Cannot add file {filename!r} to directory {folder}") from exc


class Channel(filesystem.Channel):
    """Filesystem channel whose messages appear whole or not at all."""

    def _put(self, queue, payload, **kwargs):
        write_atomically(self.data_folder_out, message_filename(queue), dumps(payload).encode())

    def _get(self, queue):
        for filename in sorted(os.listdir(self.data_folder_in)):
            if not is_message_of(filename, queue):
                continue
            taken = self._take(filename)
            if taken is None:
                continue  # another consumer took it first
            try:
                payload = taken.read_bytes()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {str(taken)!r} from queue.") from exc
            try:
                message = loads(payload.decode())
            except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                self._set_aside(taken, filename, REJECTED_FOLDER)
                log.warning(
                    "Dropped an undecodable broker message %s (%d bytes)", filename, len(payload)
                )
                continue
            if self.store_processed:
                self._set_aside(taken, filename)
            else:
                taken.unlink(missing_ok=True)
            return message
        raise Empty()

    def _take(self, filename: str) -> Path | None:
        """Claim a message by renaming it, in its own folder, to a hidden name: one
        rename within one folder is atomic, so of several consumers exactly one
        gets it (kombu's stock channel moves it to the temporary folder, which on
        another filesystem is a copy that two consumers can both make). None if
        another consumer took it first."""
        claimed = Path(self.data_folder_in) / f".taken-{uuid.uuid4().hex}-{filename}"
        try:
            os.rename(os.path.join(self.data_folder_in, filename), claimed)
        except OSError:
            return None
        return claimed

    def _set_aside(self, taken: Path, filename: str, subfolder: str = "") -> None:
        """Keep a read (or rejected) message under the processed folder for inspection."""
        folder = Path(self.processed_folder) / subfolder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.move(str(taken), folder / filename)
        except OSError:
            taken.unlink(missing_ok=True)


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT_ALIASES["filesystem"] = f"{__name__}:Transport"
