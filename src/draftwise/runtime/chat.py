"""The one place a conversation becomes token ids.

``turns[i]`` comes from the user and ``answers[i]`` from the assistant, for
``len(turns) == len(answers) + 1``: the ids end where the next answer starts. With a chat template
(and ``chat`` not False) the template renders it with ``add_generation_prompt=True``; without one
(or with ``chat=False``) the turns and answers are joined by blank lines as raw text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftwise.errors import ConfigError


def encode_conversation(
    tokenizer: Any, turns: Sequence[str], answers: Sequence[str] = (), *, chat: bool | None = None
) -> list[int]:
    """Token ids of a conversation up to the assistant's next answer.

    ``chat=None`` uses the template when the tokenizer has one; ``chat=True`` insists on it.
    """
    if len(turns) != len(answers) + 1:
        raise ConfigError(f"a conversation needs one more user turn than answers, got {len(turns)} and {len(answers)}")
    template = getattr(tokenizer, "chat_template", None)
    use_chat = bool(template) if chat is None else chat
    if use_chat:
        if not template:
            raise ConfigError("this model has no chat template; pass chat=False (or --no-chat) for raw text")
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    parts: list[str] = []
    for i, turn in enumerate(turns):
        parts.append(turn)
        if i < len(answers):
            parts.append(answers[i])
    return [int(i) for i in tokenizer("\n\n".join(parts), add_special_tokens=True)["input_ids"]]
