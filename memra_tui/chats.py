"""Chats on disk: one JSON file per chat under <data_dir>/chats, written atomically.

Serialization is deterministic (sorted keys, fixed indent), so a chat that is loaded and saved
again without changes is the same bytes. A file that does not parse is reported and left alone.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memra_tui.settings import atomic_write_text

FORMAT_VERSION = 1


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    status: str = "done"  # assistant: "done" | "stopped" | "length" | "context" | "error"
    error: str = ""
    created: float = 0.0
    sampling: dict | None = None  # assistant: the knobs that produced this reply
    grammar: dict | None = None  # assistant: the grammar that constrained it (Grammar.to_dict())
    spec: dict | None = None  # assistant: the speculative decoding that drafted it (SpecConfig.to_dict()), None: off

    @classmethod
    def from_dict(cls, d: dict) -> "ChatMessage":
        if d.get("role") not in ("user", "assistant") or not isinstance(d.get("content"), str):
            raise ValueError("message needs role user/assistant and string content")
        return cls(
            role=d["role"],
            content=d["content"],
            status=str(d.get("status", "done")),
            error=str(d.get("error", "")),
            created=float(d.get("created", 0.0)),
            sampling=d.get("sampling"),
            grammar=d.get("grammar"),
            spec=d.get("spec"),
        )


@dataclass
class Chat:
    id: str
    title: str = "New chat"
    model_path: str = ""
    system_prompt: str = ""
    sampling: dict = field(default_factory=dict)
    # Grammar.to_dict() of the grammar for this chat's replies, None for off. Kept as saved: the
    # chat screen rebuilds it, and a grammar that no longer builds turns off without losing the chat.
    grammar: dict | None = None
    # SpecConfig.to_dict() at the last save, None for off: a record, like `sampling`. Not restored:
    # speculative decoding changes the speed, not the replies, and depends on the draft model the
    # command line loads, so the command line decides it.
    spec: dict | None = None
    messages: list[ChatMessage] = field(default_factory=list)
    created: float = 0.0
    updated: float = 0.0

    def engine_messages(self) -> list[dict]:
        """What the engine sees: the system prompt, then each turn's role and text."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        out += [{"role": m.role, "content": m.content} for m in self.messages if m.content or m.role == "user"]
        return out

    def to_json(self) -> str:
        data = asdict(self)
        data["version"] = FORMAT_VERSION
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Chat":
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise ValueError("not a memra chat (missing or unknown version)")
        return cls(
            id=str(data["id"]),
            title=str(data.get("title", "")),
            model_path=str(data.get("model_path", "")),
            system_prompt=str(data.get("system_prompt", "")),
            sampling=dict(data.get("sampling") or {}),
            grammar=data.get("grammar"),
            spec=data.get("spec"),
            messages=[ChatMessage.from_dict(m) for m in data.get("messages", [])],
            created=float(data.get("created", 0.0)),
            updated=float(data.get("updated", 0.0)),
        )

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", "", f"- model: `{self.model_path}`",
                 f"- created: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.created))} UTC", ""]
        if self.system_prompt:
            lines += ["## System", "", self.system_prompt, ""]
        for m in self.messages:
            note = "" if m.status == "done" else f" ({m.status})"
            if m.status in ("length", "context") and m.grammar:
                note = f" ({m.status}, structured reply incomplete)"
            lines += [f"## {m.role.capitalize()}{note}", "", m.content, ""]
        return "\n".join(lines)


def title_from(text: str, limit: int = 48) -> str:
    first = " ".join(text.split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


class ChatStore:
    def __init__(self, chats_dir: Path, exports_dir: Path, clock=time.time):
        self.dir = chats_dir
        self.exports_dir = exports_dir
        self.clock = clock

    def path_of(self, chat_id: str) -> Path:
        return self.dir / f"{chat_id}.json"

    def new_chat(self, model_path: str, sampling: dict, grammar: dict | None = None) -> Chat:
        now = self.clock()
        base = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        chat_id, n = base, 1
        # Never reuse a name on disk: that could overwrite a corrupt file we were told to leave alone.
        while self.path_of(chat_id).exists():
            n += 1
            chat_id = f"{base}-{n}"
        return Chat(id=chat_id, model_path=model_path, sampling=sampling, grammar=grammar, created=now, updated=now)

    def save(self, chat: Chat, touch: bool = True) -> None:
        if touch:
            chat.updated = self.clock()
        atomic_write_text(self.path_of(chat.id), chat.to_json())

    def load(self, chat_id: str) -> Chat:
        return Chat.from_json(self.path_of(chat_id).read_text(encoding="utf-8"))

    def list(self) -> tuple[list[Chat], list[str]]:
        """All readable chats, newest first, and one line per file that could not be read."""
        chats, problems = [], []
        if not self.dir.is_dir():
            return chats, problems
        for path in sorted(self.dir.glob("*.json")):
            try:
                chat = Chat.from_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, KeyError, TypeError) as e:
                problems.append(f"skipped corrupt chat file {path.name}: {str(e).splitlines()[0][:80]}")
                continue
            if chat.id != path.stem:
                problems.append(f"skipped chat file {path.name}: its id says {chat.id!r}")
                continue
            chats.append(chat)
        chats.sort(key=lambda c: (c.updated, c.id), reverse=True)
        return chats, problems

    def latest(self) -> tuple[Chat | None, list[str]]:
        chats, problems = self.list()
        return (chats[0] if chats else None), problems

    def delete(self, chat_id: str) -> None:
        self.path_of(chat_id).unlink(missing_ok=True)

    def rename(self, chat: Chat, title: str) -> None:
        chat.title = title
        self.save(chat, touch=False)

    def export_markdown(self, chat: Chat) -> Path:
        out = self.exports_dir / f"{chat.id}.md"
        atomic_write_text(out, chat.to_markdown())
        return out
