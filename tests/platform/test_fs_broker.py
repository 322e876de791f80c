"""The embedded broker delivers whole messages only (lab.jobs.fs_broker).

kombu's stock filesystem channel creates a message file before writing it; a
consumer polling in between read an empty file and stopped with a
JSONDecodeError. These tests drive a real kombu connection on ``filesystem://``.

kombu keeps declared exchanges in process-wide state, so each test uses its own
queue name (a second folder would otherwise miss the binding file).
"""

from __future__ import annotations

import threading
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from lab.jobs import fs_broker


@pytest.fixture
def broker(tmp_path):
    folders = {name: tmp_path / name for name in ("queue", "control", "processed")}
    for folder in folders.values():
        folder.mkdir()
    options = {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "control_folder": str(folders["control"]),
        "processed_folder": str(folders["processed"]),
        "store_processed": False,
    }
    with Connection("filesystem://", transport_options=options) as conn:
        yield conn, folders


def test_the_filesystem_scheme_resolves_to_the_whole_message_transport(broker):
    conn, _ = broker
    assert isinstance(conn.default_channel, fs_broker.Channel)


def test_a_message_being_written_is_invisible_to_the_reader(broker):
    conn, folders = broker
    queue = conn.SimpleQueue("half")
    # A writer caught mid-write: its temporary file holds half a message.
    (folders["queue"] / ".0123abcd.part").write_bytes(b'{"body": "half')
    with pytest.raises(Empty):
        queue.get(block=False)
    queue.put({"run": 7})
    assert queue.get(block=False).payload == {"run": 7}
    queue.close()


def test_an_undecodable_message_is_set_aside_and_the_next_one_delivered(broker):
    conn, folders = broker
    queue = conn.SimpleQueue("torn")
    # What a stock kombu producer leaves between creating and writing its file.
    empty = folders["queue"] / "000000000000001_00000000-0000-0000-0000-000000000000.torn.msg"
    empty.write_bytes(b"")
    queue.put({"run": 8})
    assert queue.get(block=False).payload == {"run": 8}
    assert not empty.exists()
    assert (folders["processed"] / fs_broker.REJECTED_FOLDER / empty.name).read_bytes() == b""
    queue.close()


def test_no_message_is_torn_or_lost_while_a_writer_and_a_reader_race(broker):
    conn, folders = broker
    total = 400
    big = "x" * 64_000  # large enough that a write is not one syscall's worth of luck

    def produce():
        with Connection("filesystem://", transport_options=conn.transport_options) as c:
            q = c.SimpleQueue("race")
            for i in range(total):
                q.put({"i": i, "pad": big})
            q.close()

    writer = threading.Thread(target=produce)
    queue = conn.SimpleQueue("race")
    writer.start()
    seen = []
    while len(seen) < total:
        message = queue.get(block=True, timeout=30)
        seen.append(message.payload["i"])
        assert len(message.payload["pad"]) == len(big)
        message.ack()
    writer.join()
    queue.close()
    assert sorted(seen) == list(range(total))
    assert not (folders["processed"] / fs_broker.REJECTED_FOLDER).exists()
    assert [p.name for p in Path(folders["queue"]).iterdir()] == []


def test_two_consumers_of_one_queue_get_each_message_exactly_once(broker):
    """Workers of one queue poll the same folder: a claim is a rename within it, so
    one consumer wins each message and the other moves on."""
    conn, folders = broker
    total = 300
    queue = conn.SimpleQueue("shared")
    for i in range(total):
        queue.put({"i": i})
    received: list[list[int]] = [[], []]

    def consume(mine: list[int]):
        with Connection("filesystem://", transport_options=conn.transport_options) as c:
            q = c.SimpleQueue("shared")
            while True:
                try:
                    message = q.get(block=False)
                except Empty:
                    return
                mine.append(message.payload["i"])
                message.ack()

    threads = [threading.Thread(target=consume, args=(mine,)) for mine in received]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.close()
    assert sorted(received[0] + received[1]) == list(range(total))
    assert [p.name for p in Path(folders["queue"]).iterdir()] == []
