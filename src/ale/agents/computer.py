"""The ``computer`` tool as agents see it: its definition (shared by the MCP bridge
and the llm agent), and how a screenshot reaches a model or an MCP client.

The screenshot is a PNG file in the trajectory (path, size, sha256); it is
base64-encoded only on the wire to the model or the MCP client, never in the
trajectory's JSON.
"""

from __future__ import annotations

import base64
from typing import Any

from ale.sandbox.computer import ACTIONS

COMPUTER_SPEC: dict[str, Any] = {
    "description": (
        "Use the desktop of the task's sandbox (a screen of fixed size, 1024x768 unless stated; coordinates "
        "are pixels of the screenshot, origin top-left). Actions: screenshot (returns the image); left_click, "
        "right_click, middle_click, double_click, triple_click (at coordinate, or where the pointer is); "
        "mouse_move; left_click_drag (start_coordinate -> coordinate); left_mouse_down, left_mouse_up; "
        "scroll (scroll_direction up/down/left/right, scroll_amount clicks, at coordinate); type (text); "
        "key (text: a key or combination such as Return, Escape, ctrl+a; several separated by spaces); "
        "wait (duration seconds, at most 30); cursor_position. Take a screenshot to see the result of an action."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": [a for a in ACTIONS if a != "drag"]},
            "coordinate": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                           "description": "[x, y] in screenshot pixels."},
            "start_coordinate": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                                 "description": "[x, y] where a drag starts."},
            "text": {"type": "string", "description": "Text to type, or the key(s) to press."},
            "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
            "scroll_amount": {"type": "integer", "minimum": 1, "maximum": 50},
            "duration": {"type": "number", "description": "Seconds (wait; a drag's length)."},
        },
        "required": ["action"],
        "additionalProperties": False,
    },
}


def png_base64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def image_message(png: bytes, note: str = "The screenshot the computer tool just took:") -> dict[str, Any]:
    """An OpenAI-style chat message carrying a screenshot as image input (a tool
    message can hold only text, so the image follows it as a user message)."""
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": note},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_base64(png)}},
        ],
    }
