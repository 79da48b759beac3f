"""The chat: transcript, composer and the side panes (engine, knobs). It owns the reply in flight.

A reply runs in a thread worker that iterates the engine's Job and fills a ReplyBuffer; this
screen moves buffered text into the streaming message (at most FLUSH_HZ times a second) and stats
into the panes (at most STATS_HZ times a second). While it streams, the chat file is written again
every CHECKPOINT_S with the reply so far marked "interrupted", so a kill -9 or a power cut loses at
most that much of it; the reply's end writes its real status over it.

The token inspector (F7) puts a cursor on the replies' tokens and shows the cursor token's
candidates in a Tokens tab; while it is open, replies are asked for their top
INSPECTOR_TOP_LOGPROBS candidates (the one in flight from its next token), and not when it is
closed (they cost time). Each reply's tokens are kept in memory for the session (TokenLog), never
in the chat file.
"""
from __future__ import annotations

import logging
import math
import random
import re
import time
from dataclasses import replace

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Label, TabbedContent, TabPane

from memra_engine.errors import GrammarError
from memra_engine.events import EngineInfo, EngineStats, TokenEvent
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import SpecConfig
from memra_tui.chats import Chat, ChatMessage, title_from
from memra_tui.context_fit import Fit, fit_to_context, reply_room
from memra_tui.screens.ab_compare import ABResult, ABRun, ABScreen
from memra_tui.screens.ab_knobs import ABKnobsScreen
from memra_tui.screens.chat_list import ChatListScreen
from memra_tui.screens.context_size import ContextSizeScreen, smaller_context
from memra_tui.screens.text_prompt import ConfirmScreen, TextPromptScreen
from memra_tui.streaming import DONE_STATUS, FLUSH_HZ, STATS_HZ, ReplyBuffer, ReplyFinished, ReplyProgress, pump_job
from memra_tui.tokens import INSPECTOR_TOP_LOGPROBS
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.context_usage import ContextPane
from memra_tui.widgets.engine_header import EngineHeader
from memra_tui.widgets.engine_panes import EnginePanes
from memra_tui.widgets.fit_text import OneLine
from memra_tui.widgets.knobs import KnobsPane
from memra_tui.widgets.message_view import MessageView
from memra_tui.widgets.token_inspector import TokenInspector
from memra_tui.widgets.transcript import Transcript
from memra_tui.widgets.key_footer import KeyFooter

log = logging.getLogger("memra_tui")

CODE_BLOCK_RE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
CHECKPOINT_S = 1.0  # how often the reply in flight is saved, marked "interrupted"


def describe_knobs(p: SamplingParams, spec: SpecConfig | None = None) -> str:
    seed = "random" if p.seed is None else str(p.seed)
    # speculative decoding changes the speed, not the reply: it goes last, and only when on
    shown_spec = f" · spec {spec.mode} ≤{spec.draft_max}" if spec is not None and spec.enabled else ""
    return (f"T {p.temperature:g} · top-k {p.top_k} · top-p {p.top_p:g} · min-p {p.min_p:g} · rep {p.repeat_penalty:g}"
            f"/{p.repeat_last_n} · pres {p.presence_penalty:g} · freq {p.frequency_penalty:g} · seed {seed}"
            f" · max {p.max_tokens}{shown_spec}")


def usable_spec(spec: SpecConfig | None, info: EngineInfo) -> tuple[SpecConfig, str]:
    """The spec this engine can run; one line to show when it had to turn it off (a draft model
    was asked for but none is loaded)."""
    spec = spec or SpecConfig()
    if spec.enabled and info.remote:
        return replace(spec, mode="off"), "speculative decoding is the server's to do on a remote engine; off here"
    if spec.mode == "draft" and not info.draft_model_name:
        return replace(spec, mode="off"), "no draft model is loaded; speculative decoding off"
    return spec, ""


def load_chat_grammar(chat: Chat) -> tuple[Grammar | None, str]:
    """The chat's saved grammar, built again; one line to show instead when it no longer builds."""
    saved = chat.grammar
    if saved is None:
        return None, ""
    try:
        fields = ("kind", "source", "name")
        if not isinstance(saved, dict) or not all(isinstance(saved.get(k, ""), str) for k in fields):
            raise GrammarError("not a grammar record")
        return Grammar.from_dict(saved), ""
    except GrammarError as e:
        return None, f"this chat's saved grammar could not be used ({e}); grammar off"


class ChatScreen(Screen):
    BINDINGS = [
        Binding("f1", "app.help", "Help"),  # repeated from the app so the footer shows it early
        Binding("escape", "stop", "Stop / back"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+e", "edit_last", "Edit last"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("f2", "toggle_panes", "Panes"),
        Binding("f3", "knobs", "Knobs"),
        Binding("f6", "engine", "Engine"),  # back from the knobs to the engine panes
        Binding("f4", "chats", "Chats"),
        Binding("f5", "system_prompt", "System prompt"),
        Binding("ctrl+y", "copy_reply", "Copy reply"),
        Binding("ctrl+k", "copy_code", "Copy code"),
        Binding("f7", "inspect", "Inspect tokens", show=False),  # in the help and the palette
        Binding("f8", "toggle_tint", "Tint unlikely tokens", show=False),
        # Ctrl+B is tmux's prefix: F9 reaches the app there too
        Binding("f9,ctrl+b", "ab_send", "A/B send: two replies side by side", show=False),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]

    streaming: reactive[bool] = reactive(False)
    grammar: reactive[Grammar | None] = reactive(None)  # for the next reply; the header and knobs show it
    panes_shown: reactive[bool | None] = reactive(None)  # None: decided by the terminal width
    inspecting: reactive[bool] = reactive(False, init=False)  # the token inspector is open

    def __init__(self, chat: Chat, info: EngineInfo, sampling: SamplingParams, spec: SpecConfig | None = None) -> None:
        super().__init__()
        self.chat = chat
        self.info = info
        self.sampling = sampling
        # for the next reply and, through job.update_spec, the one in flight; the session's, like
        # the sampling knobs (it changes the speed, never the reply), not the chat's like the grammar
        self.spec = spec or SpecConfig()
        grammar, self._grammar_note = load_chat_grammar(chat)
        self.set_reactive(ChatScreen.grammar, grammar)
        self._reply_grammar: Grammar | None = None  # the grammar of the reply in flight
        self.editing_index: int | None = None  # index of the user message being edited
        self.decode_history: list[float] = []
        self._job = None
        self._buffer: ReplyBuffer | None = None
        self._reply_view: MessageView | None = None
        self._reply_branch: ChatMessage | None = None  # the fork the reply in flight continues
        self._reply_started = 0.0
        self._last_stats_shown = 0.0
        self._last_stats: EngineStats | None = None
        self._stats_unshown = False
        self._stats_timer: Timer | None = None
        self._last_flush = 0.0
        self._flush_timer: Timer | None = None  # a pending one-shot flush, while throttled
        self._context_epoch = 0  # bumped by a reply or another chat: a token count begun before is stale
        self._checkpoint_timer: Timer | None = None
        self._checkpointed = ""  # the reply text the last checkpoint saved
        self._reply_created: float | None = None  # the clock's time of the reply's first checkpoint
        self._panes_before_inspecting: bool | None = None

    # -- layout --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield EngineHeader(self.info, self.grammar).data_bind(ChatScreen.grammar)
        with Horizontal(id="body"):
            with Vertical(id="chat-column"):
                yield Transcript(id="transcript")
                yield Label("", id="edit-banner")
                yield Composer(id="composer")
                yield OneLine(describe_knobs(self.sampling, self.spec), separator="·", id="knob-summary")
            with TabbedContent(id="sidebar", initial="engine-tab"):
                with TabPane("Engine", id="engine-tab"):
                    yield EnginePanes(self.info.n_ctx, remote=self.info.remote, id="engine-panes")
                with TabPane("Knobs", id="knobs-tab"):
                    yield KnobsPane(self.sampling, self.grammar, self.spec, self.info.draft_model_name,
                                    dict(self.info.knob_notes), self.info.remote,
                                    id="knobs").data_bind(ChatScreen.grammar)
        yield KeyFooter()

    async def on_mount(self) -> None:
        await self.query_one(Transcript).show_chat(self.chat)
        self.query_one(Composer).focus()
        self._show_grammar_note()
        self._count_context()

    # -- the Context pane before any reply (a resumed or reopened chat) ------------------------
    def _count_context(self) -> None:
        """Show the open chat's tokens in the Context pane; the next reply's stats replace them."""
        self._context_epoch += 1
        messages = self.chat.engine_messages()
        if not messages:
            self.query_one(ContextPane).used = 0
            return
        self._count_worker(self._context_epoch, messages)

    @work(thread=True, group="count", exclusive=True, exit_on_error=False)
    def _count_worker(self, epoch: int, messages: list[dict]) -> None:
        engine = self.app.engine
        if engine is None:
            return
        try:
            n = engine.count_tokens(messages)
        except Exception:  # the pane keeps what it shows; the next reply reports the real number
            log.exception("counting the chat's tokens failed")
            return
        self.app.call_from_thread(self._show_context_count, epoch, n)

    def _show_context_count(self, epoch: int, n: int) -> None:
        if epoch == self._context_epoch:  # no reply and no other chat since the count began
            self.query_one(ContextPane).used = n

    def _show_grammar_note(self) -> None:
        if self._grammar_note:
            self.notify(self._grammar_note, severity="warning", timeout=10, markup=False)
            self._grammar_note = ""

    def watch_panes_shown(self, shown: bool | None) -> None:
        self.set_class(shown is True, "-panes-shown")
        self.set_class(shown is False, "-panes-hidden")

    # -- sending and streaming -----------------------------------------------------------------
    @on(Composer.Send)
    async def _send(self, event: Composer.Send) -> None:
        if self.streaming:
            self.notify("a reply is still streaming: Esc stops it", severity="warning")
            return
        await self._add_user_message(event.text)
        await self._start_reply()

    async def _add_user_message(self, text: str) -> None:
        """The composer's message at the chat's end (in edit mode: a new branch at the one edited)."""
        composer = self.query_one(Composer)
        composer.clear()
        transcript = self.query_one(Transcript)
        message = ChatMessage("user", text, created=self.app.clock())
        if self.editing_index is not None:
            # the edited message and the replies after it stay, as a sibling branch ([ ] reach it);
            # a dropped message that was edited is sent again (fork moves context_start back)
            i = self.editing_index
            self._end_edit()
            self.chat.fork(i, [message])
            await transcript.show_chat(self.chat)
            transcript.select_message(i)
            self.app.save_chat(self.chat)
            return
        if not self.chat.messages:
            self.chat.title = title_from(text)
            transcript.border_title = self.chat.title
        self.chat.messages.append(message)
        await transcript.add_message(message, len(self.chat.messages) - 1)
        self.app.save_chat(self.chat)

    async def _start_reply(self, branch: ChatMessage | None = None) -> None:
        """A new reply after the chat's last message; or, given `branch` (the chat's last message,
        a fork whose view holds the tokens it starts with), the rest of that reply."""
        engine = self.app.engine
        self._context_epoch += 1  # from here on the reply's stats say how full the context is
        self._buffer = ReplyBuffer()
        self._reply_grammar = self.grammar
        self._reply_branch = branch
        transcript = self.query_one(Transcript)
        if branch is None:
            self._reply_view = await transcript.add_message(
                ChatMessage("assistant", "", grammar=self._reply_grammar_dict()), len(self.chat.messages), tokens=[])
            messages, prefix = self.chat.engine_messages(), {}
        else:
            self._reply_view = transcript.message_views[-1]
            messages = replace(self.chat, messages=self.chat.messages[:-1]).engine_messages()
            ids = [t.id for t in self._reply_view.tokens]
            prefix = {"reply_prefix": ids} if ids else {}  # only the local engine takes one (see action_branch)
        self._reply_view.start_stream()
        self._reply_started = time.perf_counter()
        self._job = engine.chat(messages, sampling=self._engine_sampling(), grammar=self._reply_grammar,
                                spec=self.spec, **prefix)
        self.streaming = True
        self._checkpointed, self._reply_created = "", None
        self._checkpoint_timer = self.set_interval(CHECKPOINT_S, self._checkpoint_reply)
        self._stream_job(self._job, self._buffer)

    @work(thread=True, group="reply", exit_on_error=False)
    def _stream_job(self, job, buffer: ReplyBuffer) -> None:
        pump_job(job, buffer, self.post_message)

    @on(ReplyProgress)
    async def _reply_progress(self) -> None:
        if self._flush_timer is not None:
            return  # a flush is already scheduled
        wait = self._last_flush + 1 / FLUSH_HZ - time.perf_counter()
        if wait <= 0.002:
            await self._flush_reply()
        else:
            self._flush_timer = self.set_timer(wait, self._flush_due)

    def _flush_due(self) -> None:
        # A timer callback runs in the timer's own task; the flush itself must run in this screen's
        # message loop, one at a time with ReplyFinished, so the timer only posts a message.
        self._flush_timer = None
        self.post_message(ReplyProgress())

    async def _flush_reply(self, final: bool = False) -> None:
        if self._buffer is None or self._reply_view is None:
            return
        self._last_flush = time.perf_counter()
        text, stats, tokens = self._buffer.drain_all()
        if tokens:
            await self._reply_view.add_tokens(tokens)
            self.query_one(Transcript).follow_reply(self._reply_view)
        if text:
            await self._reply_view.write(text)
        if stats is not None:
            self._last_stats, self._stats_unshown = stats, True
        if self._stats_unshown:
            wait = self._last_stats_shown + 1 / STATS_HZ - time.perf_counter()
            if final or wait <= 0:
                self._show_stats()
            elif self._stats_timer is None:  # throttled: show them when the interval is up
                self._stats_timer = self.set_timer(wait, self._show_stats)

    def _show_stats(self) -> None:
        self._stats_timer = None
        if self._stats_unshown and self._last_stats is not None:
            self.query_one(EnginePanes).stats = self._last_stats
            self._stats_unshown = False
            self._last_stats_shown = time.perf_counter()

    def _reply_text(self) -> str:
        """The reply in flight's text so far: a branch's starts with the text it was forked with."""
        head = self._reply_branch.content if self._reply_branch is not None else ""
        return head + self._buffer.text

    def _with_reply(self, text: str, status: str, error: str = "") -> list[ChatMessage]:
        """The chat's messages with the reply in flight: after the last, or in place of the
        branch it continues (keeping the branches that fork there)."""
        reply = self._reply_message(text, status, error)
        if self._reply_branch is None:
            return [*self.chat.messages, reply]
        reply.branches, reply.branch = self._reply_branch.branches, self._reply_branch.branch
        return [*self.chat.messages[:-1], reply]

    def _reply_message(self, text: str, status: str, error: str = "") -> ChatMessage:
        """The reply as the chat keeps it, with the knobs, grammar and spec that produced it."""
        created = self._reply_created if self._reply_created is not None else self.app.clock()
        return ChatMessage("assistant", text, status=status, error=error, created=created,
                           sampling=self.sampling.to_dict(), grammar=self._reply_grammar_dict(), spec=self._spec_dict())

    def _checkpoint_reply(self) -> None:
        """Save the chat with the reply so far, marked interrupted: what a kill leaves on disk."""
        if self._buffer is None:
            return
        text = self._reply_text()
        if not text or text == self._checkpointed:
            return
        if self._reply_created is None:
            self._reply_created = self.app.clock()
        self._checkpointed = text
        self.app.save_chat(replace(self.chat, messages=self._with_reply(text, "interrupted")), touch=False)

    def _stop_checkpoints(self) -> None:
        if self._checkpoint_timer is not None:
            self._checkpoint_timer.stop()
            self._checkpoint_timer = None

    @on(ReplyFinished)
    async def _reply_finished(self, event: ReplyFinished) -> None:
        if event.job is not self._job:
            return
        self._stop_checkpoints()
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        await self._flush_reply(final=True)
        view, done = self._reply_view, event.done
        status = DONE_STATUS.get(done.reason, "error")
        await view.end_stream(status, done.error)
        self.query_one(Transcript).reply_ended(view)
        if view.text or status != "error" or self._reply_branch is not None:
            self.chat.messages[:] = self._with_reply(view.text, status, done.error)
            self.query_one(Transcript).token_log.put(self.chat.id, len(self.chat.messages) - 1, view.text,
                                                     view.tokens or [])
        else:  # nothing came back: keep the error on screen, but do not save an empty reply
            self.notify(f"reply failed: {done.error}", severity="error", timeout=8)
        if self._last_stats is not None and status in ("done", "length", "context", "stopped") and self._last_stats.n_generated:
            self.decode_history.append(self._last_stats.decode_tok_s)
            self.query_one(EnginePanes).history = list(self.decode_history)
        self._job = self._buffer = self._reply_view = self._reply_branch = None
        self.streaming = False
        self.app.save_chat(self.chat)
        if done.error_kind == "out_of_memory":
            self._ask_context_size(smaller_context(self.info.n_ctx), f"Out of memory: {done.error}")
        elif done.error_kind == "prompt_too_long":
            self._fit_worker(self.chat, self.sampling.max_tokens)

    # -- a conversation that outgrew the context: offer to drop the oldest turns ----------------
    @work(thread=True, group="fit", exclusive=True, exit_on_error=False)
    def _fit_worker(self, chat: Chat, max_tokens: int) -> None:
        engine = self.app.engine
        if engine is None:
            return
        try:
            fit = fit_to_context(chat, engine.count_tokens, self.info.n_ctx, reply_room(self.info.n_ctx, max_tokens))
        except Exception:  # counting failed: the error on screen already says the prompt is too long
            log.exception("counting the chat's tokens failed")
            return
        self.app.call_from_thread(self._offer_to_drop, chat, fit)

    def _offer_to_drop(self, chat: Chat, fit: Fit) -> None:
        if chat is not self.chat or self.streaming:
            return
        n_ctx = self.info.n_ctx
        if fit.start is None:
            self.notify(f"your last message does not fit the {n_ctx}-token context with room for a reply: shorten "
                        "it, or use a larger --ctx", severity="error", timeout=12)
            return
        n_drop = fit.start - chat.context_start

        def chosen(drop: bool | None) -> None:
            if drop:
                self.run_worker(self._drop_oldest(chat, fit.start), group="fit")
            else:
                self.notify("kept every message: the model cannot reply until the chat fits (Ctrl+R asks again, "
                            "Ctrl+N starts a new chat; or a larger --ctx)", severity="warning", timeout=10)

        self.app.push_screen(ConfirmScreen(
            f"This chat has outgrown the context: {fit.tokens} tokens, and the model holds {n_ctx}. Drop the "
            f"oldest {n_drop} messages from what the model sees ({fit.tokens_after} tokens left) and reply "
            "again? They stay in the chat and on screen."), chosen)

    async def _drop_oldest(self, chat: Chat, start: int) -> None:
        if chat is not self.chat or self.streaming:
            return
        n_drop = start - chat.context_start
        chat.context_start = start
        await self.query_one(Transcript).show_chat(chat)
        self.app.save_chat(chat)
        self.notify(f"the oldest {n_drop} messages are no longer sent to the model (kept in the chat)", timeout=5)
        self._count_context()
        await self._start_reply()

    def _reply_grammar_dict(self) -> dict | None:
        return self._reply_grammar.to_dict() if self._reply_grammar is not None else None

    def _spec_dict(self) -> dict | None:
        return self.spec.to_dict() if self.spec.enabled else None

    def abandon_reply(self, status: str = "stopped") -> None:
        """On quit ("stopped") or a signal ("interrupted"): cancel the reply in flight and save what
        arrived, marked with status."""
        if self._job is None:
            return
        self._job.cancel()
        self._stop_checkpoints()
        self.chat.messages[:] = self._with_reply(self._reply_text(), status)
        self._job = None
        self.streaming = False
        self.app.save_chat(self.chat)

    # -- actions -------------------------------------------------------------------------------
    def action_stop(self) -> None:
        """Esc: stop the reply; else leave edit mode; else go back to the composer."""
        if self._job is not None:
            self._job.cancel()
        elif self.editing_index is not None:
            self._end_edit()
            self.query_one(Composer).clear()
        elif self.inspecting and self.query_one(Composer).has_focus:
            self.inspecting = False
        else:
            self.query_one(Composer).focus()

    def _refuse_while_streaming(self) -> bool:
        if self.streaming:
            self.notify("a reply is streaming: Esc stops it first", severity="warning")
        return self.streaming

    async def action_regenerate(self) -> None:
        if self._refuse_while_streaming():
            return
        if not self.chat.messages:
            self.notify("nothing to regenerate yet")
            return
        last = self.chat.messages[-1]
        if last.role == "assistant" and last.branches:  # where branches fork: a new one, the old kept
            transcript = self.query_one(Transcript)
            self.chat.fork(len(self.chat.messages) - 1, [ChatMessage("assistant", "", created=self.app.clock())])
            transcript.token_log.put(self.chat.id, len(self.chat.messages) - 1, "", [])
            await transcript.show_chat(self.chat)
            return await self._start_reply(branch=self.chat.messages[-1])
        if last.role == "assistant":
            self.chat.messages.pop()
            await self.query_one(Transcript).remove_from(len(self.chat.messages))
        await self._start_reply()

    def action_edit_last(self) -> None:
        if self._refuse_while_streaming():
            return
        users = [i for i, m in enumerate(self.chat.messages) if m.role == "user"]
        if not users:
            self.notify("no message to edit yet")
            return
        self.editing_index = users[-1]
        composer = self.query_one(Composer)
        composer.text = self.chat.messages[self.editing_index].content
        composer.move_cursor(composer.document.end)
        composer.focus()
        banner = self.query_one("#edit-banner", Label)
        banner.update("editing your last message: Enter sends it as a new branch (the old one and its replies stay: "
                      "[ ] switch), Esc cancels")
        banner.add_class("-shown")

    def _end_edit(self) -> None:
        self.editing_index = None
        self.query_one("#edit-banner", Label).remove_class("-shown")

    async def action_new_chat(self) -> None:
        if self._refuse_while_streaming():
            return
        await self.open_chat(self.app.new_chat())
        self.notify("new chat (the previous one is saved: F4 lists chats)", timeout=3)

    async def open_chat(self, chat: Chat) -> None:
        self._end_edit()
        self.chat = chat
        self.grammar, self._grammar_note = load_chat_grammar(chat)
        await self.query_one(Transcript).show_chat(chat)
        self.query_one(Composer).focus()
        self._show_grammar_note()
        self._count_context()

    def action_context_size(self) -> None:
        if not self._refuse_while_streaming():
            self._ask_context_size(self.info.n_ctx)

    def _ask_context_size(self, offered: int, note: str = "") -> None:
        """Offer to load the model again with another context; the app reopens this chat after."""
        def chosen(n_ctx: int | None) -> None:
            if n_ctx is not None:
                self.app.call_later(self.app.reload_engine, n_ctx)

        self.app.push_screen(ContextSizeScreen(offered, note), chosen)

    def action_toggle_panes(self) -> None:
        shown = self.panes_shown if self.panes_shown is not None else self.has_class("-wide")
        self.panes_shown = not shown

    def action_knobs(self) -> None:
        self.panes_shown = True
        self.query_one(TabbedContent).active = "knobs-tab"
        self.query_one("#knob-temperature").focus()

    def action_engine(self) -> None:
        self.panes_shown = True
        self.query_one(TabbedContent).active = "engine-tab"
        self.query_one(Composer).focus()  # out of the knob fields: back to typing

    def action_grammar(self) -> None:
        self.panes_shown = True
        self.query_one(TabbedContent).active = "knobs-tab"
        self.query_one("#knob-grammar").focus()

    def action_chats(self) -> None:
        if self._refuse_while_streaming():
            return

        async def chosen(chat: Chat | None) -> None:
            if chat is not None and chat.id != self.chat.id:
                await self.open_chat(chat)

        self.app.push_screen(ChatListScreen(self.app.store, self.chat.id), chosen)

    def action_system_prompt(self) -> None:
        def chosen(text: str | None) -> None:
            if text is None:
                return
            self.chat.system_prompt = text
            self.app.save_chat(self.chat)
            self.run_worker(self.query_one(Transcript).show_chat(self.chat))
            self.notify("system prompt set" if text else "system prompt cleared", timeout=2)

        self.app.push_screen(TextPromptScreen("System prompt (used from the next reply on)", self.chat.system_prompt,
                                              multiline=True), chosen)

    def _last_reply(self) -> str | None:
        if self._reply_view is not None:
            return self._reply_view.text
        replies = [m.content for m in self.chat.messages if m.role == "assistant"]
        return replies[-1] if replies else None

    def action_copy_reply(self) -> None:
        reply = self._last_reply()
        if not reply:
            self.notify("no reply to copy yet")
            return
        self.app.copy_to_clipboard(reply)
        self.notify(f"copied the last reply ({len(reply)} chars)", timeout=2)

    def action_copy_code(self) -> None:
        blocks = CODE_BLOCK_RE.findall(self._last_reply() or "")
        if not blocks:
            self.notify("the last reply has no code block")
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.notify(f"copied the last code block ({len(blocks[-1].splitlines())} lines)", timeout=2)

    # -- knobs -----------------------------------------------------------------------------------
    @on(KnobsPane.Changed)
    def _knobs_changed(self, event: KnobsPane.Changed) -> None:
        self.sampling = event.params
        self.query_one("#knob-summary", OneLine).set_text(describe_knobs(event.params, self.spec))
        if self._job is not None:
            self._job.update_sampling(self._engine_sampling())  # the reply in flight takes them at its next step
        self.app.set_sampling_defaults(event.params)

    @on(KnobsPane.SpecChanged)
    def _spec_changed(self, event: KnobsPane.SpecChanged) -> None:
        self.spec = self.app.spec = event.spec
        self.query_one("#knob-summary", OneLine).set_text(describe_knobs(self.sampling, event.spec))
        if self._job is not None:
            self._job.update_spec(event.spec)  # the reply in flight takes it at its next round

    @on(KnobsPane.GrammarChosen)
    def _grammar_chosen(self, event: KnobsPane.GrammarChosen) -> None:
        self.grammar = event.grammar
        self.chat.grammar = event.grammar.to_dict() if event.grammar is not None else None
        self.app.save_chat(self.chat)
        shown = f"grammar {event.grammar.label}" if event.grammar is not None else "grammar off"
        self.notify(f"{shown} (from the next reply on)", timeout=3, markup=False)

    # -- the token inspector -------------------------------------------------------------------
    def _engine_sampling(self, knobs: SamplingParams | None = None) -> SamplingParams:
        """The knobs (default: the chat's) as the engine gets them: with candidates while the inspector is open."""
        return replace(knobs or self.sampling, top_logprobs=INSPECTOR_TOP_LOGPROBS if self.inspecting else 0)

    async def action_inspect(self) -> None:
        """F7: open the inspector with the cursor on the last reply's last token (again, if open)."""
        transcript = self.query_one(Transcript)
        self.inspecting = True
        if transcript.start_cursor():
            transcript.focus()
        else:
            self.notify("no reply to inspect yet: the next one comes with its candidates", timeout=3)

    def action_close_inspector(self) -> None:
        """Esc in the transcript: close the inspector; with it closed, Esc as elsewhere."""
        if self.inspecting:
            self.inspecting = False
        else:
            self.action_stop()

    async def watch_inspecting(self, inspecting: bool) -> None:
        if self._job is not None:
            self._job.update_sampling(self._engine_sampling())  # on or off from the reply's next token
        tabs, transcript = self.query_one(TabbedContent), self.query_one(Transcript)
        if inspecting:
            self._panes_before_inspecting = self.panes_shown
            self.panes_shown = True
            if not self.query("#tokens-tab"):
                await tabs.add_pane(TabPane("Tokens", TokenInspector(self.info.backend, id="token-inspector"),
                                            id="tokens-tab"))
            tabs.active = "tokens-tab"
        else:
            transcript.stop_cursor()
            if self.query("#tokens-tab"):
                await tabs.remove_pane("tokens-tab")
            tabs.active = "engine-tab"
            self.panes_shown = self._panes_before_inspecting
            self.query_one(Composer).focus()

    @on(Transcript.CursorMoved)
    def _cursor_moved(self, event: Transcript.CursorMoved) -> None:
        if not self.inspecting:
            if event.view is None:
                return
            self.inspecting = True  # a click on a token opens the inspector
        inspector = self.query("#token-inspector")
        if inspector:
            tokens = event.view.tokens if event.view is not None else None
            inspector.first(TokenInspector).show(tokens, event.index, has_reply=event.view is not None)
        elif self.inspecting:  # the pane is being added: show it once it is there
            self.call_after_refresh(self._cursor_moved, event)

    def action_toggle_tint(self) -> None:
        transcript = self.query_one(Transcript)
        transcript.tint = not transcript.tint
        self.notify(f"tint of unlikely tokens {'on' if transcript.tint else 'off'} (this session's replies: below "
                    "10% amber, below 1% red)", timeout=3)

    # -- branching (issue 18): fork a reply at the cursor token, move between the branches --------
    async def action_branch(self, candidate: int) -> None:
        """The reply under the token cursor forks at its cursor token: with the model's candidate
        `candidate` (0-based, a row of the first chart) in its place, or (-1) sampled again with
        the current knobs. The old reply, and all after it, stays as a sibling branch."""
        if self._refuse_while_streaming():
            return
        transcript = self.query_one(Transcript)
        view = transcript.cursor_view
        if self.info.remote:
            return self.notify("branching needs the local engine", severity="warning", timeout=4)
        if view is None or view.index is None or view.index >= len(self.chat.messages):
            return self.notify("no reply under the token cursor (F7 puts it on one)", timeout=3)
        if view.tokens is None or view.cursor is None:
            return self.notify("no token data for this reply: only this session's replies can be branched from",
                               severity="warning", timeout=4)
        at, token = view.cursor, view.tokens[view.cursor]
        prefix = list(view.tokens[:at])
        if candidate >= 0:
            c = token.candidates
            if c is None or candidate >= len(c.model):
                return self.notify(f"no candidate {candidate + 1} for this token (the inspector shows them while "
                                   "open: replies from then on have them)", severity="warning", timeout=4)
            pick = c.model[candidate]
            logprob = math.log(pick.final_prob) if pick.final_prob > 0 else -math.inf
            prefix.append(TokenEvent(pick.text, pick.id, logprob, replace(c, rank=candidate)))
        i = view.index
        text = "".join(t.text for t in prefix)
        self.chat.fork(i, [ChatMessage("assistant", text, created=self.app.clock())])
        transcript.token_log.put(self.chat.id, i, text, prefix)  # the new view starts with these tokens
        await transcript.show_chat(self.chat)
        transcript.select_message(i)
        self.app.save_chat(self.chat)
        await self._start_reply(branch=self.chat.messages[-1])

    async def action_sibling(self, delta: int) -> None:
        """[ / ]: the previous / next branch where the chat forks, at the reply under the cursor
        or the nearest fork above it (with no cursor: the last fork)."""
        if self._refuse_while_streaming():
            return
        transcript = self.query_one(Transcript)
        view = transcript.cursor_view
        below = view.index if view is not None and view.index is not None else len(self.chat.messages) - 1
        forks = [i for i, m in enumerate(self.chat.messages[:below + 1]) if m.branches]
        if not forks:
            return self.notify("no other branch here: 1-9 or r in the token inspector forks a reply", timeout=3)
        i = forks[-1]
        place, count = self.chat.siblings(i)
        self.chat.switch(i, (place + delta) % count)
        await transcript.show_chat(self.chat)
        transcript.select_message(i)
        self.app.save_chat(self.chat)
        self._count_context()

    # -- A/B (issue 18): one message, two knob sets, the replies side by side; keep one ------------
    async def action_ab_send(self) -> None:
        """F9: send the composer's message (or, with it empty, answer the chat's unanswered last
        message) as an A/B run: B's knobs are asked for first, A's are the chat's."""
        if self._refuse_while_streaming():
            return
        text = self.query_one(Composer).text.strip()
        last = self.chat.messages[-1] if self.chat.messages else None
        if not text and (last is None or last.role != "user" or self.editing_index is not None):
            return self.notify("type a message first: F9 sends it as an A/B run (two replies side by side)",
                               timeout=4)
        # each side gets a seed of its own, so either reply can be had again
        a = self.sampling if self.sampling.seed is not None else replace(self.sampling, seed=ab_seed())
        b = replace(a, seed=(a.seed + 1) % 2**31)

        async def chosen(b_knobs: SamplingParams | None) -> None:
            if b_knobs is not None and not self.streaming:
                await self._run_ab(text, a, b_knobs)

        self.app.push_screen(ABKnobsScreen(a, b, describe_knobs(a, self.spec)), chosen)

    async def _run_ab(self, text: str, a: SamplingParams, b: SamplingParams) -> None:
        if text:
            await self._add_user_message(text)
        runs = [ABRun(label, knobs, self._engine_sampling(knobs), describe_knobs(knobs, self.spec))
                for label, knobs in (("A", a), ("B", b))]
        shown = self.chat.messages[-1].content
        self.app.push_screen(ABScreen(self.app.engine, self.chat.engine_messages(), runs, self.grammar, self.spec,
                                      shown, logprobs_known=not self.info.remote), self._ab_done)

    async def _ab_done(self, result: ABResult | None) -> None:
        if result is None:
            return self.notify("A/B cancelled; your message is kept (Ctrl+R replies to it, F9 runs A/B again)",
                               timeout=5)
        grammar = self.grammar.to_dict() if self.grammar is not None else None
        i, transcript = len(self.chat.messages), self.query_one(Transcript)
        replies = [ChatMessage("assistant", r.text, status=r.status, error=r.error, created=self.app.clock(),
                               sampling=r.knobs.to_dict(), grammar=grammar, spec=self._spec_dict())
                   for r in result.replies]
        self.chat.messages.append(replies[0])
        self.chat.fork(i, replies[1:])  # B shown, A kept as its sibling: A is ‹ 1/2 ›, B ‹ 2/2 ›
        self.chat.switch(i, result.kept)
        for r in result.replies:
            transcript.token_log.put(self.chat.id, i, r.text, r.tokens)
            if r.stats is not None and r.stats.n_generated and r.status != "error":
                self.decode_history.append(r.stats.decode_tok_s)
        panes = self.query_one(EnginePanes)
        panes.history = list(self.decode_history)
        if result.replies[result.kept].stats is not None:
            panes.stats = result.replies[result.kept].stats
        await transcript.show_chat(self.chat)
        self.app.save_chat(self.chat)
        self._count_context()
        kept, other = result.replies[result.kept].label, result.replies[1 - result.kept].label
        self.notify(f"kept {kept}; {other} stays a branch of this reply ([ and ] in the transcript switch)",
                    timeout=4)


def ab_seed() -> int:
    """A seed for an A/B side when the knobs say random."""
    return random.randrange(1, 1_000_000)  # short: it is shown in the columns' headers
