"""The tool a healthy answer calls, as each API offers tools and lets the client choose.

A request that offers tools gets a call to one of them: the one its ``tool_choice`` names,
else the first function tool; none when ``tool_choice`` says ``none``. Its arguments fit
the tool's schema (`_structured.tool_arguments`).

====================  ============================================  ==========================
API                   a tool                                         naming one in tool_choice
====================  ============================================  ==========================
chat completions      ``{"type": "function", "function": {"name",    ``{"type": "function",
                      "parameters"}}``                               "function": {"name"}}``
Responses             ``{"type": "function", "name", "parameters"}``  ``{"type": "function",
                      (other tool types are not called)              "name"}``
Anthropic Messages    ``{"name", "input_schema"}``                   ``{"type": "tool", "name"}``
====================  ============================================  ==========================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Tool", "ToolError", "chat_tool", "messages_tool", "offered", "responses_tool"]


class ToolError(ValueError):
    """A tool the request offers cannot be read (the parsers answer a 400 with it)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """The tool to call: its name, and its parameters' JSON schema (None if it gave none)."""

    name: str
    schema: Any = None


def chat_tool(data: dict[str, Any]) -> Tool | None:
    """The tool a chat completion request's answer calls.

    Raises:
        ToolError: a tool without a name (so with the other two).
    """

    def read(tool: object) -> Tool | None:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            return None
        return _named(function.get("name"), function.get("parameters"), "function.name")

    choice = data.get("tool_choice")
    wanted = choice.get("function") if isinstance(choice, dict) else None
    name = wanted.get("name") if isinstance(wanted, dict) else None
    return _pick(data.get("tools"), read, choice == "none", name)


def responses_tool(data: dict[str, Any]) -> Tool | None:
    """The tool a Responses request's answer calls: a function tool only."""

    def read(tool: object) -> Tool | None:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            return None
        return _named(tool.get("name"), tool.get("parameters"), "name")

    choice = data.get("tool_choice")
    name = choice.get("name") if isinstance(choice, dict) else None
    return _pick(data.get("tools"), read, choice == "none", name)


def messages_tool(data: dict[str, Any]) -> Tool | None:
    """The tool an Anthropic Messages request's answer calls."""

    def read(tool: object) -> Tool | None:
        if not isinstance(tool, dict):
            return None
        return _named(tool.get("name"), tool.get("input_schema"), "name")

    choice = data.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    name = choice.get("name") if isinstance(choice, dict) and kind == "tool" else None
    return _pick(data.get("tools"), read, kind == "none", name)


def offered(pick: Callable[[dict[str, Any]], Tool | None], data: dict[str, Any]) -> tuple[str, ...]:
    """The names of every tool the request offers (``pick`` reads its API's tools), in its
    order; a tool it cannot read is left out (its request gets a 400 from ``pick``)."""
    tools = data.get("tools")
    if not isinstance(tools, list):
        return ()
    names = []
    for tool in tools:
        try:
            found = pick({"tools": [tool]})
        except ToolError:
            continue
        if found is not None:
            names.append(found.name)
    return tuple(names)


def _named(name: object, schema: object, field: str) -> Tool:
    if not isinstance(name, str) or not name:
        raise ToolError(f"a tool's '{field}' must be a non-empty string")
    return Tool(name, schema)


def _pick(
    tools: object, read: Callable[[object], Tool | None], none: bool, name: object
) -> Tool | None:
    """The tool named ``name`` among ``tools`` (read by ``read``), else the first one."""
    if none or not isinstance(tools, list):
        return None
    offered = [tool for tool in map(read, tools) if tool is not None]
    if not offered:
        return None
    return next((tool for tool in offered if tool.name == name), offered[0])
