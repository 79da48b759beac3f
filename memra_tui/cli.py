"""`memra-chat`: one prompt in, the streamed reply out (headless); with no --prompt, the chat UI.

Errors a user can act on (MemraError, and command-line mistakes that argparse finds) print one
line, `memra-chat: error: …`, and exit 1. Anything else is a bug: one line on stderr, the
traceback in the log file, exit 2. A flag that does nothing in the mode asked for (the UI or
--prompt) is named in one line on stderr, and the run goes on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback
from pathlib import Path

from memra_engine.errors import MemraError
from memra_engine.events import DoneEvent, MoeStats, StatsEvent, TokenEvent
from memra_engine.kv_type import check_kv_type
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import DEFAULT_DRAFT_MAX, DEFAULT_DRAFT_MIN, MAX_DRAFT, SpecConfig
from memra_tui.format import fmt_bytes, parse_size

PROG = "memra-chat"
DEFAULTS = SamplingParams()


class Parser(argparse.ArgumentParser):
    """argparse's one-line error (after the usage line), with exit status 1: a mistake on the
    command line is the user's to fix, and 2 is kept for bugs."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Chat with a local GGUF model. With --prompt, print one reply and exit; "
        "without it, open the terminal chat UI.",
        epilog="Sampling order (llama.cpp's default chain): penalties -> top-k -> top-p -> min-p -> "
        "temperature -> draw. With no MODEL the default model (SmolLM2-135M-Instruct Q4_1) is "
        "fetched once into the user cache.",
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="path to a .gguf file (default: the default model)")
    p.add_argument("--prompt", "-p", metavar="TEXT", help="send TEXT, stream the reply to stdout, exit")
    p.add_argument("--raw", action="store_true", help="skip the chat template: continue TEXT as given")
    p.add_argument("--system", metavar="TEXT",
                   help="system message for the chat template (in the UI: the system prompt of the chat it opens)")
    p.add_argument("--stop", metavar="TEXT", action="append", default=[],
                   help="stop when the reply produces TEXT (not printed); repeatable")

    s = p.add_argument_group("sampling (in the UI: the knobs this run starts with, over the saved ones)")
    s.add_argument("--max-tokens", "-n", type=int, default=DEFAULTS.max_tokens, metavar="N",
                   help=f"most tokens to generate (default {DEFAULTS.max_tokens})")
    s.add_argument("--temperature", "-t", type=float, default=DEFAULTS.temperature, metavar="T",
                   help=f"0 = greedy (default {DEFAULTS.temperature})")
    s.add_argument("--top-k", type=int, default=DEFAULTS.top_k, metavar="K",
                   help=f"keep the K most likely tokens, 0 = off (default {DEFAULTS.top_k})")
    s.add_argument("--top-p", type=float, default=DEFAULTS.top_p, metavar="P",
                   help=f"nucleus: smallest set with probability >= P, 1 = off (default {DEFAULTS.top_p})")
    s.add_argument("--min-p", type=float, default=DEFAULTS.min_p, metavar="P",
                   help=f"drop tokens below P x the best one's probability, 0 = off (default {DEFAULTS.min_p})")
    s.add_argument("--repeat-penalty", type=float, default=DEFAULTS.repeat_penalty, metavar="R",
                   help=f"penalise tokens seen in the last --repeat-last-n, 1 = off (default {DEFAULTS.repeat_penalty})")
    s.add_argument("--repeat-last-n", type=int, default=DEFAULTS.repeat_last_n, metavar="N",
                   help=f"penalty window in tokens, -1 = whole context, 0 = off (default {DEFAULTS.repeat_last_n})")
    s.add_argument("--presence-penalty", type=float, default=DEFAULTS.presence_penalty, metavar="X",
                   help=f"subtract X from tokens seen in the window (default {DEFAULTS.presence_penalty})")
    s.add_argument("--frequency-penalty", type=float, default=DEFAULTS.frequency_penalty, metavar="X",
                   help=f"subtract X per occurrence in the window (default {DEFAULTS.frequency_penalty})")
    s.add_argument("--top-logprobs", type=int, default=DEFAULTS.top_logprobs, metavar="N",
                   help="with --prompt: each token's N most likely candidates (up to 20) before and after the "
                   "sampler chain, as JSON lines (implies --format jsonl)")
    s.add_argument("--seed", "-s", type=int, default=None, metavar="S",
                   help="random seed: the same seed gives the same reply (default: random)")

    g = p.add_argument_group("grammar (every reply then parses; llama.cpp's flag names)")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--json", action="store_true", help="reply with any JSON object")
    one.add_argument("--json-schema", "-j", metavar="TEXT", help="reply with JSON that validates against this schema")
    one.add_argument("--json-schema-file", metavar="FILE", help="the JSON schema, from a file")
    one.add_argument("--grammar-file", metavar="FILE", help="a GBNF grammar file (a .lark file is read as Lark)")
    one.add_argument("--regex", metavar="RE", help="reply with text that matches RE as a whole")

    d = p.add_argument_group("speculative decoding (faster decoding; the model still decides every token)")
    d.add_argument("--draft", "--model-draft", "-md", metavar="FILE",
                   help="a small draft model (a .gguf with the model's vocabulary) drafts tokens for the model to check")
    d.add_argument("--lookup", action="store_true",
                   help="prompt lookup: draft tokens copied from the prompt and the reply so far (no draft model)")
    d.add_argument("--draft-max", type=int, default=DEFAULT_DRAFT_MAX, metavar="N",
                   help=f"most tokens drafted per round, 1 to {MAX_DRAFT} (default {DEFAULT_DRAFT_MAX})")
    d.add_argument("--draft-min", type=int, default=DEFAULT_DRAFT_MIN, metavar="N",
                   help=f"fewest drafts worth a round; with fewer, a plain step (default {DEFAULT_DRAFT_MIN})")

    r = p.add_argument_group("remote engine (an OpenAI-compatible server: vLLM, SGLang, llama-server)")
    r.add_argument("--remote", metavar="URL", help="chat with the server at URL, e.g. http://127.0.0.1:8000/v1 "
                   "(a URL with no path gets /v1)")
    r.add_argument("--model", dest="remote_model", metavar="NAME",
                   help="the server's model to use (default: the first it lists; --list-models shows them)")
    r.add_argument("--list-models", action="store_true", help="print the models the server lists, then exit")
    r.add_argument("--api-key-env", metavar="VAR", help="read the API key from environment variable VAR (default: "
                   "the key for URL in the config file remote.json, if any; never from the command line)")
    r.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds to wait to connect, and for each read of the reply (default 60)")

    e = p.add_argument_group("engine")
    e.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto takes the GPU when usable, else the CPU (default auto)")
    e.add_argument("--ctx", type=int, default=4096, metavar="N", help="context size in tokens (default 4096)")
    e.add_argument("--kv-type", default="f16", metavar="f16|q8_0",
                   help="KV cache element type: f16, or q8_0 for about half the memory (default f16)")
    e.add_argument("--moe-vram", type=size_arg, default=None, metavar="SIZE",
                   help="VRAM for MoE experts (the expert cache), e.g. 6GiB, 512MiB, 6G (binary) or 1.5GB "
                   "(decimal); default: all experts when they fit, else what fits")
    e.add_argument("--stats", action="store_true", help="print speed and memory to stderr after the reply")
    e.add_argument("--format", choices=("text", "jsonl"), default=None,
                   help="with --prompt: the reply as text (default), or one JSON object per token and one at "
                   "the end (jsonl)")

    m = p.add_argument_group("other")
    m.add_argument("--pull-default", action="store_true", help="only fetch the default model into the cache, then exit")
    m.add_argument("--resume", action="store_true", help="UI only: reopen the last conversation")
    return p


def size_arg(text: str) -> int:
    """argparse type for sizes: a bad one is argparse's one-line error (exit 1)."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, max_tokens=args.max_tokens, top_logprobs=args.top_logprobs,
    )
    try:
        params.validate()
    except ValueError as err:
        raise MemraError(str(err)) from None
    return params


def spec_from(args: argparse.Namespace) -> SpecConfig:
    """The speculative decoding the flags ask for, checked now (before the model loads)."""
    if args.lookup and args.draft is not None:
        raise MemraError("--lookup and --draft are two ways to draft: give one")
    mode = "draft" if args.draft is not None else "lookup" if args.lookup else "off"
    spec = SpecConfig(mode=mode, draft_max=args.draft_max, draft_min=args.draft_min)
    try:
        spec.validate()
    except ValueError as err:  # the engine's message names the fields: say the flags instead
        raise MemraError(str(err).replace("draft_max", "--draft-max").replace("draft_min", "--draft-min")) from None
    if args.draft is not None and not Path(args.draft).is_file():  # before the UI opens, as the other flags
        raise MemraError(f"draft model file not found: {args.draft}")
    return spec


def grammar_from(args: argparse.Namespace):
    """The grammar the flags ask for, checked now (before the model loads), or None."""
    from memra_engine.grammar import Grammar

    if args.json:
        return Grammar.json()
    if args.json_schema is not None:
        return Grammar.json_schema(args.json_schema)
    if args.json_schema_file is not None:
        return Grammar.from_file(args.json_schema_file, kind="json_schema")
    if args.grammar_file is not None:
        path = Path(args.grammar_file)
        return Grammar.from_file(path, kind="lark" if path.suffix.lower() == ".lark" else "gbnf")
    if args.regex is not None:
        return Grammar.regex(args.regex)
    return None


def run_headless(args: argparse.Namespace) -> int:
    from memra_engine.generate import Engine

    params = sampling_from(args)
    grammar = grammar_from(args)
    spec = spec_from(args)
    if args.remote is not None:
        engine = connect_remote(args)
    else:
        engine = Engine.load(args.model, backend=args.backend, n_ctx=args.ctx, draft=args.draft, kv_type=args.kv_type,
                             moe_vram=args.moe_vram, progress=say)
    try:
        if args.raw:
            job = engine.complete(args.prompt, params, stop=args.stop, grammar=grammar, spec=spec)
        else:
            if not engine.info.has_chat_template:
                say("completion mode (model has no chat template)")
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": args.prompt})
            job = engine.chat(messages, params, stop=args.stop, grammar=grammar, spec=spec)
        if output_format(args) == "jsonl":
            return stream_jsonl(job, params.top_logprobs)
        return stream(job, args.stats, grammar, spec, remote=engine.info.remote)
    finally:
        engine.close()


def stream(job, show_stats: bool, grammar=None, spec: SpecConfig | None = None, remote: bool = False) -> int:
    last_text, stats = "", None
    try:
        for event in job:
            if isinstance(event, TokenEvent) and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                last_text = event.text
            elif isinstance(event, StatsEvent):
                stats = event.stats
            elif isinstance(event, DoneEvent):
                if last_text and not last_text.endswith("\n"):
                    sys.stdout.write("\n")
                sys.stdout.flush()
                if event.reason == "error":
                    raise MemraError(event.error)
                if event.reason == "context":
                    say(f"{PROG}: the context is full ({stats.n_ctx_used if stats else '?'} tokens): the reply "
                        "was cut there (a larger --ctx, or a new chat)")
                if grammar is not None and event.reason in ("length", "context"):
                    say(f"{PROG}: the structured reply ({grammar.label}) is incomplete: it was cut by "
                        "--max-tokens or the context")
                if show_stats and stats is not None:
                    memory = "remote server" if remote else f"rss {stats.vram.process_rss / 2**20:.0f} MB"
                    say(f"[{event.reason}] {stats.n_generated} tokens, decode {stats.decode_tok_s:.1f} tok/s, "
                        f"prefill {stats.prefill_tok_s:.1f} tok/s, first token {stats.time_to_first_token_s:.2f} s, "
                        f"context {stats.n_ctx_used}/{stats.n_ctx}, {memory}")
                    if spec is not None and spec.enabled:
                        say(f"spec: accepted {stats.spec_accepted} of {stats.spec_drafted} drafted, "
                            f"mean length {stats.spec_mean_length:.2f}")
                    if stats.moe is not None:
                        say(moe_line(stats.moe))
    except KeyboardInterrupt:
        job.cancel()
        sys.stdout.write("\n")
        return 130
    return 0


def output_format(args: argparse.Namespace) -> str:
    """--format, where --top-logprobs implies jsonl (candidates have no plain-text form)."""
    if args.top_logprobs > 0 and args.format == "text":
        raise MemraError("--top-logprobs prints JSON lines: use --format jsonl (or leave --format out)")
    return args.format or ("jsonl" if args.top_logprobs > 0 else "text")


def candidate_json(c) -> dict:
    return {"id": c.id, "text": c.text, "model_prob": c.model_prob, "final_prob": c.final_prob,
            "removed_by": c.removed_by}


def stream_jsonl(job, top_logprobs: int) -> int:
    """One JSON object per token ({"text", "id", "logprob"}, with --top-logprobs also "rank",
    "model" and "final" candidates: engine/candidates.py), then {"done": reason, ...}."""
    stats, noted = None, False
    try:
        for event in job:
            if isinstance(event, TokenEvent):
                line = {"text": event.text, "id": event.id, "logprob": event.logprob}
                c = event.candidates
                if c is not None:
                    line.update(rank=c.rank, model=[candidate_json(x) for x in c.model],
                                final=[candidate_json(x) for x in c.final])
                elif top_logprobs and not noted:
                    say(f"{PROG}: note: no candidates for some tokens (speculative rounds on the cuda backend "
                        "and remote servers report none): tokens only there")
                    noted = True
                sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
                sys.stdout.flush()
            elif isinstance(event, StatsEvent):
                stats = event.stats
            elif isinstance(event, DoneEvent):
                end = {"done": event.reason}
                if event.error:
                    end["error"] = event.error
                if stats is not None:
                    end.update(n_generated=stats.n_generated, decode_tok_s=stats.decode_tok_s,
                               prefill_tok_s=stats.prefill_tok_s, n_ctx_used=stats.n_ctx_used)
                sys.stdout.write(json.dumps(end) + "\n")
                sys.stdout.flush()
                return 1 if event.reason == "error" else 0
    except KeyboardInterrupt:
        job.cancel()
        return 130
    return 0


def moe_line(m: MoeStats) -> str:
    """The --stats line of the expert cache: this reply's counters, and the hit rate since load."""
    return (f"moe: hits {m.hits} of {m.hits + m.misses} ({m.hit_rate:.1%}; {m.total_hit_rate:.1%} since load), "
            f"copied {fmt_bytes(m.bytes_moved)} at {m.copy_gb_s:.1f} GB/s, "
            f"resident {m.resident_experts}/{m.total_experts} experts")


SAMPLING_FLAGS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty", "seed", "top_logprobs")


def given_flags(argv: list[str] | None) -> set[str]:
    """The dests of the options written on the command line (not those left at their defaults), so
    a flag given at its default value still counts as asked for."""
    p = build_parser()
    for action in p._actions:  # argparse has no public way to ask which options were given
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_known_args(argv)[0]))


def ui_sampling(args: argparse.Namespace) -> dict:
    """The sampling flags given for the UI: the knobs this run starts with (a bad value is one line
    on stderr, before the UI opens)."""
    params = sampling_from(args)
    return {d: getattr(params, d) for d in SAMPLING_FLAGS if d in args.given and d != "top_logprobs"}


def ignored_flags(args: argparse.Namespace) -> str:
    """One line naming the flags given that the mode asked for does nothing with, or ""."""
    if args.pull_default:
        return ""
    if args.prompt is not None:
        return "memra-chat: note: --resume does nothing with --prompt (it reopens a chat in the UI); ignored" \
            if args.resume else ""
    given = [flag for flag, on in (("--raw", args.raw), ("--stop", args.stop), ("--stats", args.stats),
                                   ("--format", args.format is not None), ("--top-logprobs", args.top_logprobs)) if on]
    if not given:
        return ""
    why = " (in the UI: the token inspector, F7)" if args.top_logprobs else ""
    return (f"memra-chat: note: {', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing without --prompt{why}; "
            "ignored")


REMOTE_ONLY = (("--model", "remote_model"), ("--list-models", "list_models"), ("--api-key-env", "api_key_env"),
               ("--timeout", "timeout"))
LOCAL_ONLY = (("--backend", "backend", "auto"), ("--ctx", "ctx", 4096), ("--kv-type", "kv_type", "f16"),
              ("--moe-vram", "moe_vram", None), ("--draft", "draft", None), ("--lookup", "lookup", False),
              ("--pull-default", "pull_default", False))


def check_remote_flags(args: argparse.Namespace) -> None:
    """The remote flags need --remote; the local engine's flags do nothing with it (one note)."""
    if args.remote is None:
        for flag, dest in REMOTE_ONLY:
            if getattr(args, dest) not in (None, False):
                raise MemraError(f"{flag} needs --remote URL")
        return
    if args.model is not None:
        raise MemraError("a model file and --remote are two engines: give one (the server's model is --model NAME)")
    given = [flag for flag, dest, default in LOCAL_ONLY if getattr(args, dest) != default]
    if given:
        say(f"{PROG}: note: {', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing with --remote "
            "(the server runs the model); ignored")
        args.draft, args.lookup = None, False


def remote_api_key(args: argparse.Namespace) -> str | None:
    """The API key: from the environment variable --api-key-env names, else the config file's
    entry for this server, else none. Never from the command line."""
    import os

    from memra_engine.remote import base_url
    from memra_tui.settings import AppPaths, config_api_key

    if args.api_key_env is not None:
        key = os.environ.get(args.api_key_env, "")
        if not key:
            raise MemraError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
        return key
    return config_api_key(AppPaths.default(), base_url(args.remote))


def connect_remote(args: argparse.Namespace, api_key: str | None = None, progress=say):
    from memra_engine.generate import Engine

    if api_key is None:
        api_key = remote_api_key(args)
    return Engine.remote(args.remote, model=args.remote_model, api_key=api_key, timeout=args.timeout,
                         progress=progress)


def list_models(args: argparse.Namespace) -> int:
    engine = connect_remote(args)
    try:
        for name in engine.models:
            print(name)
    finally:
        engine.close()
    return 0


def load_ui():
    """memra_tui.app.run_app, imported late (the headless path must not load Textual). A UI
    library that is not installed is one line on stderr, not an internal error."""
    try:
        from memra_tui.app import run_app
    except ModuleNotFoundError as err:
        raise MemraError(f"the chat UI needs the {err.name!r} package, which is not installed here "
                         f"(pip install textual, or ask for --prompt to run without the UI)") from None
    return run_app


def run(args: argparse.Namespace) -> int:
    check_remote_flags(args)
    if args.list_models:
        return list_models(args)
    if note := ignored_flags(args):
        say(note)
    if args.pull_default:
        from memra_engine.default_model import ensure_default_model

        print(ensure_default_model(progress=say))
        return 0
    check_kv_type(args.kv_type)  # before the UI opens: a bad value is one line on stderr
    if args.prompt is None:
        grammar = grammar_from(args)  # an invalid one: one line on stderr, no UI
        spec = spec_from(args)
        knobs = ui_sampling(args)
        if args.remote is not None:
            # the server first: one that cannot be reached is one line on stderr, before the UI opens
            key = remote_api_key(args)
            remote = (connect_remote(args, key, say), lambda progress: connect_remote(args, key, progress))
            return load_ui()(None, args.backend, args.ctx, args.resume, args.kv_type, grammar=grammar, spec=spec,
                           remote=remote, sampling=knobs, system=args.system)
        return load_ui()(args.model, args.backend, args.ctx, args.resume, args.kv_type, grammar=grammar,
                       draft=args.draft, spec=spec, moe_vram=args.moe_vram, sampling=knobs, system=args.system)
    return run_headless(args)


def log_crash() -> Path | None:
    try:
        import platformdirs

        path = Path(platformdirs.user_log_dir("memra")) / "memra-chat.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"--- {datetime.datetime.now().isoformat()} {' '.join(sys.argv)}\n")
            f.write(traceback.format_exc())
        return path
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.given = given_flags(argv)
    try:
        return run(args)
    except MemraError as err:
        say(f"{PROG}: error: {err}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `memra-chat … | head`: the reader left, nothing to report
        return 0
    except Exception as err:
        where = log_crash()
        say(f"{PROG}: internal error: {type(err).__name__}: {err}" + (f" (traceback in {where})" if where else ""))
        return 2


if __name__ == "__main__":
    sys.exit(main())
