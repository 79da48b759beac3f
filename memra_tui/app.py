"""The memra Textual app: load the engine on a worker thread, then chat.

`run_app` is what `memra-chat` calls when there is no --prompt. `MemraApp` takes everything it
needs as arguments (paths, the engine loader, a clock), so tests run it on tmp dirs with a
scripted engine.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message

from memra_engine.errors import MemraError, OutOfMemory
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import SpecConfig
from memra_tui.chats import Chat, ChatStore
from memra_tui.commands import MemraCommands
from memra_tui.gc_tuning import SWITCH_INTERVAL_S, settle_heap, unsettle_heap
from memra_tui.screens.ab_compare import ABScreen
from memra_tui.screens.chat import ChatScreen, usable_spec
from memra_tui.screens.chat_list import ChatListScreen
from memra_tui.screens.context_size import smaller_context
from memra_tui.screens.help import HelpScreen
from memra_tui.screens.load_error import LoadErrorScreen
from memra_tui.screens.loading import LoadingScreen
from memra_tui.settings import AppPaths, load_sampling_defaults, save_sampling_defaults
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.transcript import Transcript

log = logging.getLogger("memra_tui")

# SIGTERM (kill, a logout, systemd) and SIGHUP (the terminal closed): save the chat, then exit 128 + signal
EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

EngineLoader = Callable[..., object]  # Engine.load's signature: (path, backend=, n_ctx=, draft=, progress=, kv_type=, moe_vram=) -> Engine


class LoadProgress(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class EngineLoaded(Message):
    def __init__(self, engine, model: str) -> None:
        super().__init__()
        self.engine = engine
        self.model = model


class LoadFailed(Message):
    def __init__(self, error: str, model: str, out_of_memory: bool = False) -> None:
        super().__init__()
        self.error = error
        self.model = model
        self.out_of_memory = out_of_memory


class MemraApp(App[int]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "memra"
    COMMANDS = App.COMMANDS | {MemraCommands}
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Help"),
    ]

    def __init__(self, model: str | None, backend: str = "auto", n_ctx: int = 4096, resume: bool = False, *,
                 paths: AppPaths, load_engine: EngineLoader, clock: Callable[[], float] = time.time,
                 picker_root: Path | None = None, kv_type: str = "f16", grammar: Grammar | None = None,
                 draft: str | None = None, spec: SpecConfig | None = None, moe_vram: int | None = None,
                 sampling: dict | None = None, system: str | None = None, settle_gc: bool = False) -> None:
        super().__init__()
        self.settle_gc = settle_gc  # freeze the heap after each load (gc_tuning; run_app's, not the tests')
        self.model = model
        self.backend = backend
        self.n_ctx = n_ctx
        self.kv_type = kv_type
        self.resume = resume
        self.initial_grammar = grammar  # from the command line: the grammar of the chat it opens, and of new chats
        self.draft = draft  # the draft model's path, loaded with every model
        self.moe_vram = moe_vram  # bytes of VRAM for MoE experts (--moe-vram), for every model loaded
        self.spec = spec or SpecConfig()  # from the command line, then the knobs: for every chat of this run
        self.paths = paths
        self.load_engine = load_engine
        self.clock = clock
        self.picker_root = picker_root or Path.cwd()
        self.store = ChatStore(paths.chats_dir, paths.exports_dir, clock)
        self.sampling, settings_note = load_sampling_defaults(paths)
        if sampling:  # given on the command line: this run starts with them; saved only once a knob changes
            self.sampling = replace(self.sampling, **sampling)
        self.initial_system = system  # from the command line, like the grammar: the opened chat's and new chats'
        self._settings_note = settings_note
        self.engine = None
        self._reopen_chat: Chat | None = None  # the chat to show again once a reload is done
        self._engine_closing = False
        self._crash_line = ""

    # -- loading -------------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self._settings_note:
            self.notify(self._settings_note, severity="warning", timeout=8)
        if not self.is_headless:  # a terminal that can close under us; tests call exit_on_signal themselves
            loop = asyncio.get_running_loop()
            for signum in EXIT_SIGNALS:
                try:
                    loop.add_signal_handler(signum, self.exit_on_signal, signum)
                except (NotImplementedError, RuntimeError):  # an event loop without signals (Windows)
                    log.info("cannot catch %s here", signal.Signals(signum).name)
        self.load_model(self.model)

    def exit_on_signal(self, signum: int) -> None:
        """SIGTERM or SIGHUP: save the reply in flight, marked interrupted, and exit 128 + signum."""
        log.info("%s: saving the chat and exiting", signal.Signals(signum).name)
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                screen.abandon_reply("interrupted")
        self.exit(128 + signum)

    def load_model(self, model: str | None, n_ctx: int | None = None) -> None:
        """Load model (None: the default one), with n_ctx tokens of context if given."""
        if n_ctx is not None:
            self.n_ctx = n_ctx
        if self.settle_gc:
            unsettle_heap()
        screen = LoadingScreen(model or "the default model (SmolLM2-135M-Instruct Q4_1)")
        if len(self.screen_stack) > 1:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)
        self._load(model)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, model: str | None) -> None:
        shown = model or "default model"
        try:
            engine = self.load_engine(model, backend=self.backend, n_ctx=self.n_ctx, kv_type=self.kv_type,
                                      draft=self.draft, moe_vram=self.moe_vram,
                                      progress=lambda text: self.post_message(LoadProgress(text)))
        except MemraError as e:
            log.info("load failed: %s", e)
            self.post_message(LoadFailed(str(e).splitlines()[0] if str(e) else type(e).__name__, shown,
                                         out_of_memory=isinstance(e, OutOfMemory)))
            return
        except Exception as e:  # a bug: full traceback to the log, one line on screen
            log.exception("load crashed")
            self.post_message(LoadFailed(f"internal error ({type(e).__name__}: {e}); details in {self.paths.log_file}",
                                         shown))
            return
        if self._engine_closing or not self.post_message(EngineLoaded(engine, model or "")):
            engine.close()  # the app went away while we were loading

    def on_load_progress(self, message: LoadProgress) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.add_step(message.text)

    def on_load_failed(self, message: LoadFailed) -> None:
        offered_ctx = smaller_context(self.n_ctx) if message.out_of_memory else None
        self.switch_screen(LoadErrorScreen(message.error, "" if message.model == "default model" else message.model,
                                           self.picker_root, offered_ctx))

    async def reload_engine(self, n_ctx: int) -> None:
        """Load the same model again with n_ctx tokens of context (say, after running out of
        memory) and reopen the chat that was open. The old engine goes first, and its memory with it."""
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                screen.abandon_reply()
                self._reopen_chat = screen.chat
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
        self.load_model(self.model or None, n_ctx)

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        if self._engine_closing:
            message.engine.close()
            return
        self.engine = message.engine
        self.model = message.model or self.model
        if self.settle_gc:
            settle_heap()
        chat, self._reopen_chat = self._reopen_chat, None
        if chat is None and self.resume:
            chat, problems = self.store.latest()
            for line in problems:
                self.notify(line, severity="warning", timeout=10)
            if chat is None:
                self.notify("no saved chat to resume; starting a new one", timeout=4)
            else:  # asked for on this command line: they win over the saved ones
                if self.initial_grammar is not None:
                    chat.grammar = self.initial_grammar.to_dict()
                if self.initial_system is not None:
                    chat.system_prompt = self.initial_system
        self.spec, spec_note = usable_spec(self.spec, self.engine.info)
        if spec_note:
            self.notify(spec_note, severity="warning", timeout=8)
        self.switch_screen(ChatScreen(chat or self.new_chat(), self.engine.info, self.sampling, self.spec))

    # -- chats and settings --------------------------------------------------------------------
    def new_chat(self) -> Chat:
        model_path = self.model or (self.engine.info.model_name if self.engine else "")
        grammar = self.initial_grammar.to_dict() if self.initial_grammar is not None else None
        chat = self.store.new_chat(str(model_path), self.sampling.to_dict(), grammar)
        chat.system_prompt = self.initial_system or ""
        return chat

    def save_chat(self, chat: Chat, touch: bool = True) -> None:
        chat.sampling = self.sampling.to_dict()
        chat.spec = self.spec.to_dict() if self.spec.enabled else None
        try:
            self.store.save(chat, touch)
        except OSError as e:
            self.notify(f"could not save the chat: {e}", severity="error", timeout=10)

    def set_sampling_defaults(self, params: SamplingParams) -> None:
        self.sampling = params
        try:
            save_sampling_defaults(self.paths, params)
        except OSError as e:
            self.notify(f"could not save settings: {e}", severity="error")

    # -- app-wide actions ----------------------------------------------------------------------
    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen([
            ("app", self.BINDINGS),
            ("chat", ChatScreen.BINDINGS),
            ("chat (also while typing)", Composer.BINDINGS[3:]),
            ("composer", Composer.BINDINGS[:3]),
            ("chat list", ChatListScreen.BINDINGS),
            ("token cursor (F7)", Transcript.BINDINGS),
            ("A/B (F9)", ABScreen.BINDINGS),
            ("knobs", [Binding("tab", "", "next field"), Binding("shift+tab", "", "previous field")]),
            ("palette", [Binding("ctrl+p", "", "command palette")]),
        ]))

    def action_save_svg(self) -> None:
        try:
            self.paths.screenshots_dir.mkdir(parents=True, exist_ok=True)
            path = self.save_screenshot(path=str(self.paths.screenshots_dir))
        except OSError as e:
            self.notify(f"could not save the screenshot: {e}", severity="error")
            return
        self.notify(f"screenshot saved to {path}", timeout=4)

    async def action_quit(self) -> None:
        await self.shutdown_engine()
        self.exit(0)

    async def shutdown_engine(self) -> None:
        """Stop the reply in flight (saving it, marked stopped) and close the engine's thread."""
        self._engine_closing = True
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                screen.abandon_reply()
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)

    async def on_unmount(self) -> None:
        await self.shutdown_engine()

    # -- errors: a bug goes to the log file, the terminal gets one line ------------------------
    def _handle_exception(self, error: Exception) -> None:
        log.error("unhandled error in the UI", exc_info=error)
        self._crash_line = f"memra: internal error ({type(error).__name__}: {error}); details in {self.paths.log_file}"
        super()._handle_exception(error)

    def _print_error_renderables(self) -> None:
        if self._crash_line:
            self._exit_renderables.clear()
            print(self._crash_line, file=sys.stderr)
        super()._print_error_renderables()


def connected(engine, reconnect: Callable) -> EngineLoader:
    """A loader that hands over an engine already connected (the remote one: the CLI connects
    before the UI opens, so an unreachable server is one line on stderr), then connects again
    for any later load."""
    first = [engine]

    def load(model, progress=None, **_):
        return first.pop() if first else reconnect(progress)

    return load


def setup_logging(log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def run_app(model: str | None, backend: str, n_ctx: int, resume: bool, kv_type: str = "f16",
            grammar: Grammar | None = None, draft: str | None = None, spec: SpecConfig | None = None,
            moe_vram: int | None = None, remote=None, sampling: dict | None = None, system: str | None = None) -> int:
    """Open the chat app on `model` (None: the default model). Returns the process exit code.
    grammar: a memra_engine.grammar.Grammar from the command line, active for the chat's replies.
    draft: a draft model's path, loaded with the model; spec: the speculative decoding to start with;
    moe_vram: bytes of VRAM for MoE experts (None: the engine decides);
    remote: (a connected RemoteEngine (engine/remote.py), a function of progress that connects
    again), to chat through instead of loading a model; sampling: knob values from the command line,
    over the saved ones, for this run; system: the system prompt of the chat it opens and of new chats."""
    from memra_engine.generate import Engine

    paths = AppPaths.default()
    setup_logging(paths.log_file)
    load_engine = Engine.load
    if remote is not None:
        engine, reconnect = remote
        load_engine = connected(engine, reconnect)
        model = f"{engine.info.model_name} at {engine.info.device_name}"
    app = MemraApp(model, backend, n_ctx, resume, paths=paths, load_engine=load_engine, kv_type=kv_type,
                   grammar=grammar, draft=draft, spec=spec, moe_vram=moe_vram, sampling=sampling, system=system,
                   settle_gc=True)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the engine thread gets the GIL back within 50 µs of asking
    code = app.run()
    return app.return_code if code is None else int(code)
