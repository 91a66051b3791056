"""Task cards: timeouts, resources, data sources, malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale.tasks.card import TaskCard, load_card
from ale.tasks.loader import TaskError


def card(tmp_path: Path, data) -> Path:
    text = data if isinstance(data, str) else json.dumps(data)
    (tmp_path / "task_card.json").write_text(text)
    return tmp_path


def test_absent_card_gives_defaults(tmp_path):
    c = load_card(tmp_path)
    assert c == TaskCard()
    assert c.timeout_s is None and c.resources == {} and c.data_source is None and c.raw == {}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"vm": {"timeout_s": 1800}}, 1800.0),
        ({"vm": {"timeout_s": 12.5}}, 12.5),
        ({"vm": {"timeout_s": "600"}}, 600.0),
        ({"vm": {"timeout_s": " 90.5 "}}, 90.5),
        ({"vm": {"timeout": 300}}, 300.0),
        ({"vm": {"timeout": "45"}}, 45.0),
        ({"timeout_s": 120}, 120.0),
        ({"timeout_s": "7"}, 7.0),
        ({"vm": {"timeout_s": 100, "timeout": 200}, "timeout_s": 300}, 100.0),
        ({"vm": {"timeout": 200}, "timeout_s": 300}, 200.0),
        ({"vm": {"timeout_s": None}, "timeout_s": 300}, 300.0),
        ({"vm": {"snapshot": "cpu-free-ubuntu"}}, None),
    ],
)
def test_timeout_variants(tmp_path, data, expected):
    assert load_card(card(tmp_path, data)).timeout_s == expected


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"vm": {"timeout_s": "soon"}}, r"vm\.timeout_s must be a number of seconds, got 'soon'"),
        ({"vm": {"timeout_s": 0}}, r"vm\.timeout_s must be a positive finite number"),
        ({"vm": {"timeout": -5}}, r"vm\.timeout must be a positive finite number"),
        ({"timeout_s": True}, r"timeout_s must be a number, got bool"),
        ({"timeout_s": [1]}, r"timeout_s must be a number, got list"),
        ({"timeout_s": "nan"}, r"timeout_s must be a positive finite number"),
        ({"vm": "big"}, r"vm must be an object"),
        ({"resources": [1]}, r"resources must be an object"),
        ({"vm": {"memory": "lots"}}, r"vm\.memory must be a size"),
        ({"data_source": 3}, r"data_source must be a non-empty string"),
        ([1, 2], r"the task card must be a JSON object, got list"),
    ],
)
def test_bad_values_name_the_file(tmp_path, data, pattern):
    path = card(tmp_path, data)
    with pytest.raises(TaskError, match=pattern) as e:
        load_card(path)
    assert str(path.resolve() / "task_card.json") in str(e.value)


def test_malformed_json_names_file_and_line(tmp_path):
    path = card(tmp_path, '{\n  "vm": {\n    "timeout_s": 10,\n  }\n}\n')
    with pytest.raises(TaskError) as e:
        load_card(path)
    msg = str(e.value)
    assert str(path.resolve() / "task_card.json") in msg
    assert "invalid JSON at line 4" in msg


def test_resources_from_ale_vm_block_and_resources_block(tmp_path):
    c = load_card(card(tmp_path, {"vm": {"vcpus": 4, "memory_gb": 16, "disk_gb": 200}}))
    assert c.resources == {"cpus": 4.0, "memory": 16 * 1024**3}
    c = load_card(
        card(tmp_path, {"resources": {"cpus": "1.5", "memory": "512m"}, "vm": {"vcpus": 8}})
    )
    assert c.resources == {"cpus": 1.5, "memory": 512 * 1024**2}
    c = load_card(card(tmp_path, {"vm": {"memory": "2GiB"}}))
    assert c.resources == {"memory": 2 * 1024**3}
    c = load_card(card(tmp_path, {"vm": {"memory": 1048576}}))
    assert c.resources == {"memory": 1048576}


def test_local_data_source_is_resolved_against_the_task_folder(tmp_path):
    task = tmp_path / "tasks" / "files" / "wc"
    task.mkdir(parents=True)
    c = load_card(card(task, {"data_source": "local:../../../data"}))
    assert c.data_source == f"local:{(tmp_path / 'data').resolve()}"
    c = load_card(card(task, {"data_source": "local:/srv/data"}))
    assert c.data_source == "local:/srv/data"
    c = load_card(card(task, {"task_data_source": "gs://bucket/prefix"}))
    assert c.data_source == "gs://bucket/prefix"


def test_raw_keeps_the_whole_card(tmp_path):
    data = {"taskId": "demo/x", "title": "T", "vm": {"timeout_s": 5, "snapshot": "s"}}
    assert load_card(card(tmp_path, data)).raw == data


def test_a_computer_server_screen_runs_only_under_qemu(tmp_path):
    card(tmp_path, {"desktop": {"width": 1024, "height": 768, "screen": "computer-server"}})
    c = load_card(tmp_path)
    assert c.desktop_screen == "computer-server" and c.unsupported_reason("qemu") is None
    why = c.unsupported_reason("docker")
    assert why is not None and "--provider qemu" in why and "desktop.screen" in why
    card(tmp_path, {"desktop": {"width": 1024, "height": 768}})
    assert load_card(tmp_path).desktop_screen is None and load_card(tmp_path).unsupported_reason("docker") is None
    card(tmp_path, {"desktop": {"screen": "vnc"}})
    with pytest.raises(TaskError, match="desktop.screen must be 'computer-server'.*'vnc'"):
        load_card(tmp_path)
