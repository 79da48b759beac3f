"""Chats on disk: one JSON file per chat under <data_dir>/chats, written atomically.

Serialization is deterministic (sorted keys, fixed indent), so a chat that is loaded and saved
again without changes is the same bytes. A file that does not parse, or holds the wrong types, is
reported in one line and moved aside to <name>.corrupt-<UTC time> (its bytes as they were), so it
is neither listed again nor ever overwritten. A file from a newer memra is skipped and left alone.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memra_tui.settings import atomic_write_text

FORMAT_VERSION = 1
MAX_BRANCH_DEPTH = 200  # forks inside forks in a file: bounds the reader's recursion


class ChatFileError(ValueError):
    """The file is not a chat this version can read; the message is one line."""


def _text(data: dict, key: str, default: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ChatFileError(f"{key} is a {type(value).__name__}, not text")
    return value


LAST_TIME = 253_402_300_800.0  # 10000-01-01 UTC: later times (and NaN) break time.gmtime in the chat list


def _number(data: dict, key: str) -> float:
    """A timestamp: seconds since 1970, one the chat list can show."""
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ChatFileError(f"{key} is a {type(value).__name__}, not a number")
    if not 0.0 <= value < LAST_TIME:
        raise ChatFileError(f"{key} is {value!r}, not a time")
    return float(value)


def _record(data: dict, key: str) -> dict | None:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise ChatFileError(f"{key} is a {type(value).__name__}, not an object")
    return value


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    # assistant: "done" | "stopped" | "length" | "context" | "error" | "interrupted" (the app was
    # killed or its terminal closed mid-reply: the text is what had arrived)
    status: str = "done"
    error: str = ""
    created: float = 0.0
    sampling: dict | None = None  # assistant: the knobs that produced this reply
    grammar: dict | None = None  # assistant: the grammar that constrained it (Grammar.to_dict())
    spec: dict | None = None  # assistant: the speculative decoding that drafted it (SpecConfig.to_dict()), None: off
    # The chat tree, kept around the branch on screen: when this message is where branches fork,
    # `branches` holds the other ones, each the list of messages that would stand in place of this
    # message and all after it, and `branch` is this one's place among them all (Chat.siblings).
    branches: list[list["ChatMessage"]] = field(default_factory=list)
    branch: int = 0

    @classmethod
    def from_dict(cls, d: dict, depth: int = 0) -> "ChatMessage":
        if not isinstance(d, dict):
            raise ChatFileError(f"a message is a {type(d).__name__}, not an object")
        if d.get("role") not in ("user", "assistant") or not isinstance(d.get("content"), str):
            raise ChatFileError("message needs role user/assistant and string content")
        branches = d.get("branches", [])
        if not isinstance(branches, list) or not all(isinstance(b, list) and b for b in branches):
            raise ChatFileError("branches is not a list of message lists")
        if depth > MAX_BRANCH_DEPTH:
            raise ChatFileError(f"branches nested more than {MAX_BRANCH_DEPTH} deep")
        branch = d.get("branch", 0)
        if isinstance(branch, bool) or not isinstance(branch, int) or not 0 <= branch <= len(branches):
            raise ChatFileError(f"branch is {branch!r}, not a place among {len(branches) + 1} branches")
        return cls(
            role=d["role"],
            content=d["content"],
            status=_text(d, "status", "done"),
            error=_text(d, "error"),
            created=_number(d, "created"),
            sampling=_record(d, "sampling"),
            grammar=_record(d, "grammar"),
            spec=_record(d, "spec"),
            branches=[[cls.from_dict(m, depth + 1) for m in b] for b in branches],
            branch=branch,
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
    # messages[:context_start] were dropped from the model's context when the chat outgrew it (the
    # user said yes): kept here and on screen, no longer sent
    context_start: int = 0

    def engine_messages(self, start: int | None = None) -> list[dict]:
        """What the engine sees: the system prompt, then each turn's role and text from
        messages[start] on (default: context_start)."""
        start = self.context_start if start is None else start
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        out += [{"role": m.role, "content": m.content} for m in self.messages[start:] if m.content or m.role == "user"]
        return out

    # -- the chat tree (issue 18: branching a reply from any token) -----------------------------

    def siblings(self, i: int) -> tuple[int, int]:
        """(place of the branch on screen, number of branches) at message i: (0, 1) where none fork."""
        m = self.messages[i]
        return m.branch, len(m.branches) + 1

    def fork(self, i: int, tail: list[ChatMessage]) -> None:
        """A new branch at message i: `tail` stands in place of messages[i:], which is kept as a
        branch (the last of the siblings: the new one is shown)."""
        m = self.messages[i]
        self._show(i, m.branches[:m.branch] + [self.messages[i:]] + m.branches[m.branch:] + [tail], len(m.branches) + 1)

    def switch(self, i: int, to: int) -> None:
        """Show branch `to` (0-based among Chat.siblings(i)) at message i."""
        m = self.messages[i]
        if not 0 <= to <= len(m.branches):
            raise IndexError(f"branch {to} of {len(m.branches) + 1}")
        if to != m.branch:
            self._show(i, m.branches[:m.branch] + [self.messages[i:]] + m.branches[m.branch:], to)

    def _show(self, i: int, tails: list[list[ChatMessage]], to: int) -> None:
        for tail in tails:  # only the head on screen carries the siblings
            tail[0].branches, tail[0].branch = [], 0
        shown = tails[to]
        shown[0].branches, shown[0].branch = tails[:to] + tails[to + 1:], to
        self.messages[i:] = shown
        self.context_start = min(self.context_start, i)  # what was dropped before i stays dropped

    def to_json(self) -> str:
        data = asdict(self)
        data["version"] = FORMAT_VERSION
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Chat":
        """The chat in `text`; ChatFileError (a ValueError) with one line when it is not one:
        JSON that does not parse, another version, or a field of the wrong type."""
        try:
            data = json.loads(text)
        except RecursionError:
            raise ChatFileError("JSON nested too deeply") from None
        except ValueError as e:
            raise ChatFileError(f"not valid JSON ({e})") from None
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise ChatFileError("not a memra chat (missing or unknown version)")
        messages = data.get("messages", [])
        if not isinstance(messages, list):
            raise ChatFileError(f"messages is a {type(messages).__name__}, not a list")
        if not isinstance(data.get("id"), str) or not data["id"]:
            raise ChatFileError("id is missing or not text")
        context_start = data.get("context_start", 0)
        if isinstance(context_start, bool) or not isinstance(context_start, int) or not 0 <= context_start <= len(messages):
            raise ChatFileError(f"context_start is {context_start!r}, not a message index")
        return cls(
            id=data["id"],
            title=_text(data, "title"),
            model_path=_text(data, "model_path"),
            system_prompt=_text(data, "system_prompt"),
            sampling=_record(data, "sampling") or {},
            grammar=_record(data, "grammar"),
            spec=_record(data, "spec"),
            messages=[ChatMessage.from_dict(m) for m in messages],
            created=_number(data, "created"),
            updated=_number(data, "updated"),
            context_start=context_start,
        )

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", "", f"- model: `{self.model_path}`",
                 f"- created: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.created))} UTC", ""]
        if self.system_prompt:
            lines += ["## System", "", self.system_prompt, ""]
        for i, m in enumerate(self.messages):
            if i == self.context_start and i:
                lines += [f"*The {i} messages above were dropped from the model's context to make room.*", ""]
            note = "" if m.status == "done" else f" ({m.status})"
            if m.status in ("length", "context") and m.grammar:
                note = f" ({m.status}, structured reply incomplete)"
            if m.branches:
                note += f" (branch {m.branch + 1} of {len(m.branches) + 1})"
            lines += [f"## {m.role.capitalize()}{note}", "", m.content, ""]
        return "\n".join(lines)


def is_newer_format(raw: bytes) -> bool:
    """A chat file whose version is a later one than this memra reads (not corrupt: left alone)."""
    try:
        version = json.loads(raw).get("version")
    except (ValueError, AttributeError, RecursionError):
        return False
    return isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION


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
        """All readable chats, newest first, and one line per file that could not be read. A corrupt
        file is moved aside (set_aside), so the next list does not report it again."""
        chats, problems = [], []
        if not self.dir.is_dir():
            return chats, problems
        for path in sorted(self.dir.glob("*.json")):
            try:
                raw = path.read_bytes()
            except OSError as e:
                problems.append(f"skipped chat file {path.name}: could not read it ({e.strerror or e})")
                continue
            try:
                chat = Chat.from_json(raw.decode("utf-8"))
            except UnicodeDecodeError:
                problems.append(self.set_aside(path, "not UTF-8 text"))
                continue
            except ChatFileError as e:
                if is_newer_format(raw):
                    problems.append(f"skipped chat file {path.name}: written by a newer memra; left as it is")
                else:
                    problems.append(self.set_aside(path, str(e)))
                continue
            if chat.id != path.stem:
                problems.append(f"skipped chat file {path.name}: its id says {chat.id!r}")
                continue
            chats.append(chat)
        chats.sort(key=lambda c: (c.updated, c.id), reverse=True)
        return chats, problems

    def set_aside(self, path: Path, reason: str) -> str:
        """Rename a corrupt chat file to <name>.corrupt-<UTC time> (never over another file) and
        return the one line that says so."""
        reason = " ".join(reason.split())[:80]
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.clock()))
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        try:
            path.rename(aside)
        except OSError as e:
            return f"skipped corrupt chat file {path.name}: {reason}; could not move it aside ({e.strerror or e})"
        return f"skipped corrupt chat file {path.name}: {reason}; kept aside as {aside.name}"

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
