"""LogFollower: only new bytes, whole lines, and the right thing on truncation, rotation and a saved position."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from glm53.probe.logtail import MAX_PARTIAL_BYTES, LogFollower, TailPosition


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def _rotate(path: Path) -> None:
    """What `glm53 supervise` does: FILE becomes FILE.1 (replacing it) and a fresh FILE is started."""
    os.replace(path, path.with_name(path.name + ".1"))
    path.touch()


def test_missing_file_is_nothing_yet(tmp_path: Path) -> None:
    follower = LogFollower(tmp_path / "vllm.log")
    assert follower.read_new_lines() == []
    assert follower.bytes_read == 0
    assert follower.unread_bytes() == 0


def test_reads_only_new_complete_lines_and_keeps_the_partial_one(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"one\ntwo\nthr")
    follower = LogFollower(log)
    assert follower.read_new_lines() == ["one", "two"]
    assert follower.read_new_lines() == []
    _append(log, b"ee\r\nfour")
    assert follower.read_new_lines() == ["three"]
    _append(log, b"\n")
    assert follower.read_new_lines() == ["four"]
    assert follower.bytes_read == log.stat().st_size == follower.total_bytes_read
    assert follower.unread_bytes() == 0


def test_invalid_utf8_is_replaced_not_raised(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"ok \xff\xfe\x00 end\n")
    assert LogFollower(log).read_new_lines() == ["ok \ufffd\ufffd\x00 end"]


def test_multibyte_character_split_across_reads_survives(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    bar = "\u2588".encode()
    log.write_bytes(b"progress " + bar[:1])
    follower = LogFollower(log)
    assert follower.read_new_lines() == []
    _append(log, bar[1:] + b" 100%\n")
    assert follower.read_new_lines() == ["progress \u2588 100%"]


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"a long first line\nsecond\n")
    follower = LogFollower(log)
    assert len(follower.read_new_lines()) == 2
    log.write_bytes(b"new\n")  # truncated in place, shorter than the offset
    assert follower.read_new_lines() == ["new"]
    assert follower.position.offset == 4


def test_rotation_finishes_the_old_file_then_reads_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"old 1\nold 2 start")
    follower = LogFollower(log)
    assert follower.read_new_lines() == ["old 1"]
    _append(log, b" end\nold 3\n")  # written after our last read, before the rotation
    _rotate(log)
    _append(log, b"new 1\nnew 2")
    assert follower.read_new_lines() == ["old 2 start end", "old 3", "new 1"]
    assert follower.position.inode == log.stat().st_ino
    assert follower.total_bytes_read == (tmp_path / "vllm.log.1").stat().st_size + len(b"new 1\nnew 2")


def test_rotation_hands_out_the_old_files_unfinished_last_line(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"killed mid-li")
    follower = LogFollower(log)
    assert follower.read_new_lines() == []
    _rotate(log)
    _append(log, b"fresh\n")
    assert follower.read_new_lines() == ["killed mid-li", "fresh"]


def test_rotated_twice_skips_the_lost_generation(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"gen 1\n")
    follower = LogFollower(log)
    assert follower.read_new_lines() == ["gen 1"]
    _append(log, b"gen 1 tail\n")
    _rotate(log)
    _append(log, b"gen 2\n")
    _rotate(log)  # FILE.1 is now generation 2, not the inode we were reading
    _append(log, b"gen 3\n")
    assert follower.read_new_lines() == ["gen 3"]


def test_position_round_trips_through_json_and_resumes(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"first\nhalf")
    follower = LogFollower(log)
    assert follower.read_new_lines() == ["first"]
    saved = json.loads(json.dumps(follower.position.to_json()))
    _append(log, b" done\nlast\n")
    resumed = LogFollower(log, TailPosition.from_json(saved))
    assert resumed.read_new_lines() == ["half done", "last"]
    assert resumed.bytes_read == len(b" done\nlast\n")
    assert resumed.total_bytes_read == log.stat().st_size


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a JSON object"),
        ({"device": 1, "inode": 2, "offset": -1, "total_bytes": 0, "partial": ""}, "non-negative integer 'offset'"),
        ({"device": 1, "inode": 2, "offset": 0, "total_bytes": True, "partial": ""}, "'total_bytes'"),
        ({"device": 1, "inode": 2, "offset": 0, "total_bytes": 0}, "base64 string 'partial'"),
        ({"device": 1, "inode": 2, "offset": 0, "total_bytes": 0, "partial": "!!", "head": ""}, "not base64"),
        ({"device": 1, "inode": 2, "offset": 0, "total_bytes": 0, "partial": "", "head": "QUJD" * 30}, "exceeds"),
    ],
)
def test_corrupt_position_is_refused(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TailPosition.from_json(data)


def test_runaway_partial_line_is_cut_at_the_cap(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"x" * (MAX_PARTIAL_BYTES * 2 + 10))
    follower = LogFollower(log)
    lines = follower.read_new_lines()
    assert [len(line) for line in lines] == [MAX_PARTIAL_BYTES, MAX_PARTIAL_BYTES]
    assert len(follower.position.partial) == 10
    assert TailPosition.from_json(follower.position.to_json()) == follower.position


def test_max_bytes_reads_a_backlog_in_batches(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    follower = LogFollower(log)
    assert follower.unread_bytes() == log.stat().st_size
    first = follower.read_new_lines(max_bytes=64)
    assert follower.bytes_read == 64
    assert follower.unread_bytes() == log.stat().st_size - 64
    lines = first
    while follower.unread_bytes():
        lines += follower.read_new_lines(max_bytes=64)
    assert lines == [f"line {i}" for i in range(100)]


def test_a_recycled_inode_with_other_first_bytes_is_a_new_file(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"generation one\n")
    follower = LogFollower(log)
    assert follower.read_new_lines() == ["generation one"]
    log.write_bytes(b"generation two\n")  # same inode, same size: only the first bytes tell them apart
    assert follower.read_new_lines() == ["generation two"]
