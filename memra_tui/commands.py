"""Command palette (Ctrl+P) entries for the main actions."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (title, help, action on the chat screen or the app)
COMMANDS = [
    ("New chat", "start a new chat; the current one stays saved", "screen.new_chat"),
    ("Regenerate reply", "drop the last reply and generate it again", "screen.regenerate"),
    ("Edit last message", "put your last message back in the composer to resend", "screen.edit_last"),
    ("Stop reply", "stop the reply being generated", "screen.stop"),
    ("System prompt", "set the system prompt of this chat", "screen.system_prompt"),
    ("Chats", "open, rename, delete or export saved chats", "screen.chats"),
    ("Knobs", "edit sampling parameters and speculative decoding", "screen.knobs"),
    ("Grammar", "constrain replies: JSON, a JSON schema, a regex, Lark or GBNF", "screen.grammar"),
    ("Context size", "load the model again with another context size; the chat stays open", "screen.context_size"),
    ("Inspect tokens", "a cursor on the last reply's tokens; the Tokens tab shows each one's candidates",
     "screen.inspect"),
    ("Tint unlikely tokens", "toggle: tint this session's low-probability draws (below 10%, below 1%)",
     "screen.toggle_tint"),
    ("A/B send", "send the message with two knob sets (B: a new seed, or edit it); keep one reply, the other "
     "stays a branch", "screen.ab_send"),
    ("Toggle panes", "show or hide the engine and knobs panes", "screen.toggle_panes"),
    ("Copy reply", "copy the last reply to the clipboard", "screen.copy_reply"),
    ("Copy code block", "copy the last code block of the last reply", "screen.copy_code"),
    ("Save screenshot", "save an SVG of the screen under the data dir", "app.save_svg"),
    ("Help: keys", "list every key", "app.help"),
]


class MemraCommands(Provider):
    def _available(self):
        from memra_tui.screens.chat import ChatScreen

        on_chat = isinstance(self.screen, ChatScreen)
        return [(t, h, a) for t, h, a in COMMANDS if on_chat or a.startswith("app.")]

    async def discover(self) -> Hits:
        for title, help_text, action in self._available():
            yield DiscoveryHit(title, partial(self.app.run_action, action.removeprefix("screen."), self.screen), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in self._available():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.app.run_action, action.removeprefix("screen."), self.screen),
                          help=help_text)
