"""OpenAI-style chat messages: the one place they are shaped and measured."""

from __future__ import annotations

from novelbus.writers.provider import ChatMessage, ModelReply


def system_message(text: str) -> ChatMessage:
    return {"role": "system", "content": text}


def user_message(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


def assistant_message(reply: ModelReply) -> ChatMessage:
    # An empty string, not null, beside tool calls: some servers (llama-cpp-python) refuse null.
    message: ChatMessage = {"role": "assistant", "content": reply.text or ""}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def tool_message(tool_call_id: str, content: str) -> ChatMessage:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


def message_chars(message: ChatMessage) -> int:
    """Raw characters a message puts on the wire: its content plus any tool-call names and arguments."""
    content = message.get("content")
    total = len(content) if isinstance(content, str) else 0
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        total += len(fn.get("name", "")) + len(fn.get("arguments", ""))
    return total
