"""One request to ale's desktop helper (``desktopd.py``), the harness's per-call
client: ``python3 -I -S desktopctl.py < request.json``. The same answer as
``desktopd.py call`` (one JSON line, then the screenshot's bytes), with nothing
but ``socket`` and ``json`` imported (the helper's own module loads ctypes and
more: tens of milliseconds per call on a loaded machine)."""

import json
import socket
import sys

CTL = "/tmp/.ale-desktop/ctl.sock"


def main() -> None:
    req = sys.stdin.buffer.read() or b"{}"
    json.loads(req)  # a request is one JSON object
    out = sys.stdout.buffer
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(120)
        s.connect(CTL)
        with s:
            s.sendall(req.strip() + b"\n")
            while True:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
    except OSError as e:
        out.write(json.dumps({"ok": False, "error": f"the desktop is not running ({e})", "bytes": 0}).encode() + b"\n")
    out.flush()


main()
