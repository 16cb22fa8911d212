"""A conversation's turn in each API's own form: the history a chat client re-sends.

`loadgen chat` (run/multiturn.py) sends each turn through the same backend and transport as a
sweep's requests; only the body differs, because it carries the conversation so far. These are
the two renderings of that history:

- `turn_prompt` (/completion): raw text, "User: ...\\nAssistant:..." per exchange.
- `chat_messages` (/v1/chat/completions): each earlier message as `user`, the server's answer to
  it as `assistant`, then the new message.

The salt opens each (the text, or the first message), so two conversations never share a prefix.
"""

from __future__ import annotations

History = list[tuple[str, str]]  # (the user's message, the server's answer), turn by turn


def turn_prompt(salt: str, history: History, message: str) -> str:
    """The raw-text prompt of a turn: the salt, the earlier (message, answer) pairs, the new message."""
    past = "".join(f"User: {m}\nAssistant:{a}\n" for m, a in history)
    return f"[{salt}] {past}User: {message}\nAssistant:"


def chat_messages(salt: str, history: History, message: str) -> list[dict[str, str]]:
    """The messages of a turn: each earlier exchange as user and assistant, then the new message;
    the salt opens the first one."""
    turns: list[tuple[str, str | None]] = [*history, (message, None)]
    out: list[dict[str, str]] = []
    for i, (m, a) in enumerate(turns):
        out.append({"role": "user", "content": f"[{salt}] {m}" if i == 0 else m})
        if a is not None:
            out.append({"role": "assistant", "content": a})
    return out
