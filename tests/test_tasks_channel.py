"""The task channel: big text and bytes cross as raw blobs after the message's line,
intact, within the channel's limit; an answer above it is an OSError in the task."""

from __future__ import annotations

import asyncio
import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

from ale.tasks import process as task_process
from ale.tasks.process import TaskProcess
from ale.tasks.runtime._ale_task_worker import protocol
from tests.ale_tree import write

BIG = 3 * 1024 * 1024


def test_a_frame_carries_big_text_and_bytes_raw_and_small_values_as_json():
    text = "\0" * BIG + "é\udc80 end"  # NULs (six bytes each as JSON) and a lone surrogate
    data = bytes(range(256)) * (BIG // 256)
    msg = {"op": "session_result", "sid": 3, "ok": True,
           "value": {"text": text, "data": data, "small": b"\x00\x01", "nan": math.nan, "t": (1, "x")}}
    chunks = protocol.frame(msg)
    assert len(chunks) == 3 and sum(len(c) for c in chunks) < 2 * BIG + 4096  # raw: no escapes, no base64
    assert chunks[0].count(b"\n") == 1 and chunks[0].endswith(b"\n")
    back = protocol.loads(b"".join(chunks))
    value = back["value"]
    assert value["text"] == text and value["data"] == data and value["small"] == b"\x00\x01"
    assert math.isnan(value["nan"]) and value["t"] == [1, "x"]
    assert protocol.loads(protocol.dumps({"op": "exit"})) == {"op": "exit"}  # no blob: one JSON line, as ever
    assert protocol.dumps({"op": "exit"}) == b'{"op":"exit"}\n'


@pytest.mark.parametrize("line", [
    b'{"op":"x","$blobs":[-1]}\n', b'{"op":"x","$blobs":"5"}\n', b'[1]\n',
    b'{"op":"x","v":{"$blob":1,"$t":"s"},"$blobs":[1]}\n',
])
def test_a_malformed_frame_is_a_protocol_error(line):
    with pytest.raises(ValueError):
        obj, sizes = protocol.head(line)
        protocol.decode(obj, [b"x" * n for n in sizes])


def test_a_frame_announcing_more_than_the_limit_is_refused_before_it_is_read():
    with pytest.raises(ValueError, match="above the channel's limit"):
        protocol.head(b'{"op":"x","$blobs":[%d]}\n' % protocol.MAX_MESSAGE)


class BigFiles:
    def __init__(self) -> None:
        self.text = "\0" * BIG + "tail"
        self.data = bytes(range(256)) * (BIG // 256)
        self.written: dict[str, bytes] = {}

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return self.text

    async def read_bytes(self, path: str) -> bytes:
        return self.data

    async def write_bytes(self, path: str, content: bytes) -> None:
        self.written[path] = content


GRADER = '''
    import hashlib
    import cua_bench as cb
    @cb.tasks_config
    def load():
        return [cb.Task(description="x")]
    @cb.evaluate_task
    async def evaluate(cfg, session):
        try:
            text = await session.read_file("/workspace/answer.txt")
        except OSError as e:
            return {"error": type(e).__mro__[1].__name__, "message": str(e)}
        data = await session.read_bytes("/workspace/answer.bin")
        await session.write_bytes("/workspace/back.bin", data[::-1])
        return {"text": len(text), "tail": text[-4:], "sha": hashlib.sha256(data).hexdigest(), "echo": text}
'''


def _evaluate(tmp_path: Path, session: Any) -> Any:
    d = write(tmp_path / "t" / "main.py", GRADER).parent

    async def go() -> Any:
        async with TaskProcess(d) as proc:
            value = await proc.call("evaluate", 0, session)
            assert proc.alive
            return value

    return asyncio.run(go())


def test_a_grader_reads_and_writes_big_files_whole_through_its_jailed_process(tmp_path):
    s = BigFiles()
    got = _evaluate(tmp_path, s)
    assert got["text"] == BIG + 4 and got["tail"] == "tail" and got["echo"] == s.text
    assert got["sha"] == hashlib.sha256(s.data).hexdigest()
    assert s.written["/workspace/back.bin"] == s.data[::-1]


def test_an_answer_above_the_channels_limit_is_an_oserror_in_the_task_whose_process_lives_on(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "MAX_MESSAGE", BIG)  # the harness's side: what it may send
    assert task_process.protocol is protocol
    got = _evaluate(tmp_path, BigFiles())
    assert got["error"] == "OSError" and "above the task channel's limit" in got["message"], got
