"""The probe rules' one exception for a cua control server: a listener is tolerated
only when the ``control_server`` section names it held by a process with exactly the
candidate's rights (TCP on the loopback only). The same rules on a real sandbox:
tests/test_cua_docker.py."""

from __future__ import annotations

import pytest

from ale.isolation.probe_rules import MARK
from ale.isolation.probes import parse_probes
from ale.sandbox.cua.sandbox import judge_rights, server_argv, server_port
from ale.sandbox.policy import IsolationPolicy

ZERO = "0000000000000000"
TCP = "tcp 0100007F:1F40 0A 00000000:0000"
X = "unix 00010000 01 /tmp/.X11-unix/X99 w"


def verdicts(control: str | None, sockets: tuple[str, ...] = (TCP, X)) -> dict[str, bool | None]:
    raw = f"{MARK}sockets ===\n" + "".join(s + "\n" for s in sockets) + f"{MARK}processes ===\nself 40\n1 1000 0 python3\n"
    if control is not None:
        raw += f"{MARK}control_server ===\nkind cua-computer-server port 8000\n{control}"
    checks = parse_probes(raw, IsolationPolicy(), input_dir="/input", workspace_dir="/output")
    return {c.id: c.ok for c in checks if c.id in ("probe.no_inet_listeners", "probe.unix_listeners_private")}


def holder(kind_addr: str, uid: str = "1000", gid: str = "1000", eff: str = ZERO, nnp: str = "1") -> str:
    return f"{kind_addr} 7 {uid} {gid} {eff} {ZERO} {ZERO} {nnp}\n"


def test_listeners_without_a_control_server_are_refused() -> None:
    assert verdicts(None) == {"probe.no_inet_listeners": False, "probe.unix_listeners_private": False}


def test_a_control_server_with_the_candidates_rights_is_tolerated() -> None:
    control = holder("tcp 0100007F:1F40") + holder("unix /tmp/.X11-unix/X99")
    assert verdicts(control) == {"probe.no_inet_listeners": True, "probe.unix_listeners_private": True}


@pytest.mark.parametrize("line", [
    holder("tcp 0100007F:1F40", uid="0"),  # root's
    holder("tcp 0100007F:1F40", gid="0"),
    holder("tcp 0100007F:1F40", eff="00000000a80425fb"),  # with capabilities
    holder("tcp 0100007F:1F40", nnp="0"),  # could gain privileges
    "tcp 0100007F:1F40 7 1000\n",  # unreadable
])
def test_a_holder_with_other_rights_is_not(line: str) -> None:
    assert verdicts(line + holder("unix /tmp/.X11-unix/X99"))["probe.no_inet_listeners"] is False


def test_only_the_loopback_and_only_what_is_named() -> None:
    public = "tcp 0A000002:1F40 0A 00000000:0000"
    control = holder("tcp 0A000002:1F40") + holder("unix /tmp/.X11-unix/X99")
    assert verdicts(control, (public, X))["probe.no_inet_listeners"] is False
    other = "tcp 0100007F:2328 0A 00000000:0000"  # a listener the section does not name
    assert verdicts(holder("tcp 0100007F:1F40") + holder("unix /tmp/.X11-unix/X99"), (TCP, other, X))[
        "probe.no_inet_listeners"] is False


def test_server_detection_and_rights_judgement() -> None:
    cfg = {"Config": {"Entrypoint": ["/opt/cua/computer-server"], "Cmd": ["--host", "127.0.0.1", "--port", "8123"]}}
    argv = server_argv(cfg)
    assert argv is not None and server_port(argv) == 8123
    assert server_argv({"Config": {"Cmd": ["sleep", "infinity"]}}) is None
    assert server_port(["python", "-m", "computer_server"]) == 8000
    me = {"Uid": ["1000"] * 4, "Gid": ["1000"] * 4, "CapEff": [ZERO], "CapPrm": [ZERO], "CapAmb": [ZERO], "NoNewPrivs": ["1"]}
    assert judge_rights({"self": me, "servers": [{"pid": 7, "status": me}]})["mode"] == "same-rights"
    root = {**me, "Uid": ["0"] * 4}
    assert judge_rights({"self": me, "servers": [{"pid": 7, "status": root}]})["mode"] == "unproven"
    assert judge_rights({"self": me, "servers": []})["mode"] == "unproven"
