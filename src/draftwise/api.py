"""The public entry points: :func:`generate` and :func:`stream` with every option, ``k="auto"``
included. The bench, the server and the CLI call these, never the core loop directly.

They are :func:`draftwise.core.decode.generate` / :func:`draftwise.core.decode.stream` (the core loop,
which takes a number or a :class:`~draftwise.core.kpolicy.KPolicy`) plus one thing the core must not
know: ``k="auto"`` builds the adaptive policy from this machine's measured profile
(:func:`draftwise.planner.route.policy_for`, which measures and caches one on first use).

A draft is a drafter object or a spec (:class:`draftwise.drafters.DraftSpec`): ``"none"`` (plain
decoding), ``"lookup"`` (prompt lookup), ``"suffix"`` (suffix decoding, which also proposes from
earlier answers), ``"self"`` (self-speculation on some of the target's layers), ``"model:PATH"``
or ``"model:default"`` (a smaller model), ``"eagle:PATH"`` or ``"eagle:default"`` (an EAGLE head
on the target's hidden states), and the hybrid ``"suffix+eagle:default"`` (a copy draft and the
head's guess in one token tree).

:class:`Conversation` keeps a chat's K/V between turns in a prefix cache of its own
(:mod:`draftwise.runtime.prefix_cache`), so each turn prefills only what is new; ``generate`` and
``stream`` take ``prefix_cache=`` for the same reuse across any calls.

Nothing here changes the process. :func:`share_cores_while_decoding` is the opt-in the CLI and
the server make: other draftwise processes decoding on this machine then share the cores.

Example (loads the embedded default model)::

    from draftwise import SamplingConfig, generate, load_model, stream
    model = load_model("default")
    print(generate(model, "Name a colour.", max_new_tokens=8).text)
    for piece in stream(model, "Tell me a story.", sampling=SamplingConfig(temperature=0.7, seed=0)):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from draftwise.core import decode
from draftwise.core.decode import Stream
from draftwise.core.draft import Drafter
from draftwise.core.generation import GenerationResult
from draftwise.core.kpolicy import KPolicy
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.planner.route import policy_for
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.loaders import Model, load_model
from draftwise.runtime.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from draftwise.threads import share_cores

KArg = int | Literal["auto"] | KPolicy

#: What a call that names no draft runs: suffix decoding (the measured winner) with the adaptive
#: k. ``draft="none"`` or ``draft=None`` decodes plainly.
DEFAULT_DRAFT = "suffix"
DEFAULT_K: Literal["auto"] = "auto"


def share_cores_while_decoding(enabled: bool = True) -> None:
    """Opt in (or out) to sharing this machine's cores with other draftwise processes while
    decoding: before each target pass, at most twice a second, this process uses ``cores //
    processes decoding`` threads (:func:`draftwise.threads.share_cores`). The CLI and the server
    turn it on; a library call never does."""
    (decode.add_step_hook if enabled else decode.remove_step_hook)(share_cores)


def _policy(model: Model, draft: Drafter | DraftSpec | str | None, k: KArg) -> int | KPolicy:
    if k == "auto" and isinstance(draft, Drafter):
        raise ConfigError(
            f"k='auto' (the default) needs a draft spec (e.g. draft='suffix'), not a drafter object "
            f"({draft.name}): the profile is keyed by spec; with a drafter object pass a number, e.g. k=4"
        )
    return policy_for(model, draft, k)  # type: ignore[arg-type]


def stream(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    draft: Drafter | DraftSpec | str | None = DEFAULT_DRAFT,
    k: KArg = DEFAULT_K,
    **options: Any,
) -> Stream:
    """Start a generation and return a :class:`~draftwise.core.decode.Stream` of text pieces.

    ``prompt`` is text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as they are. ``draft`` is a drafter object or a
    spec: ``"suffix"`` (the default), ``"lookup"``, ``"self"``, ``"model:PATH"`` (see
    :class:`draftwise.drafters.DraftSpec`), or ``"none"`` / ``None`` for plain decoding; ``k`` is
    how many tokens it proposes per step, or ``"auto"`` (the default) to choose k (or no
    speculation) every step from the machine profile and the acceptance seen so far
    (:mod:`draftwise.policy.adaptive`). The first ``"auto"`` call for a model and draft on a
    machine measures that profile (about 200 short target passes and ten prompt prefills) and
    caches it; later calls read it. A drafter object needs a number for ``k``. The other options
    (``max_new_tokens=128``, ``sampling``, ``stop``, ``chat``) are those of
    :func:`draftwise.core.decode.stream`.
    """
    if isinstance(model, str):
        model = load_model(model)
    drafter = make_drafter(draft, model)  # a draft that cannot run on this model fails before any measuring
    return decode.stream(model, prompt, draft=drafter, k=_policy(model, draft, k), **options)


def generate(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    draft: Drafter | DraftSpec | str | None = DEFAULT_DRAFT,
    k: KArg = DEFAULT_K,
    **options: Any,
) -> GenerationResult:
    """Generate a completion of ``prompt``; see :func:`stream` for the arguments.

    The output is exactly what plain decoding of the target gives (greedy: token for token;
    sampling: in distribution), whatever the draft; the draft only changes the speed.
    """
    if isinstance(model, str):
        model = load_model(model)
    drafter = make_drafter(draft, model)  # a draft that cannot run on this model fails before any measuring
    return decode.generate(model, prompt, draft=drafter, k=_policy(model, draft, k), **options)


class Conversation:
    """A chat with ``model`` that keeps its K/V between turns: each :meth:`say` sends the whole
    conversation so far (as ``draftwise generate`` and the server build it), and the prefix cache
    gives back what the earlier turns computed, prompts and answers, so a turn prefills only its
    new text. The answers are exactly those of :func:`generate` on the same conversation.

    ``cache``: a :class:`~draftwise.runtime.prefix_cache.PrefixCache` to share (default: one of
    its own, ``cache_mb`` MiB, freed with the conversation); ``draft``, ``k`` and ``chat`` as
    :func:`stream` takes them (default: ``draft="suffix"``, ``k="auto"``), for every turn.

    Example (loads the embedded default model)::

        chat = Conversation(load_model("default"), draft="lookup")
        print(chat.say("Name three colours.", max_new_tokens=32).text)
        print(chat.say("Now in French.", max_new_tokens=32).cached_tokens)  # the first turn's, reused
    """

    def __init__(self, model: Model | str, *, draft: Drafter | DraftSpec | str | None = DEFAULT_DRAFT,
                 k: KArg = DEFAULT_K, chat: bool | None = None, cache: PrefixCache | None = None,
                 cache_mb: int = DEFAULT_PREFIX_CACHE_MB) -> None:
        self.model = load_model(model) if isinstance(model, str) else model
        self.cache = cache if cache is not None else PrefixCache.of_megabytes(cache_mb)
        self.draft, self.k, self.chat = draft, k, chat
        self.turns: list[str] = []
        self.answers: list[str] = []

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids of the conversation so far with ``text`` as the next user turn."""
        if not isinstance(text, str) or not text:
            raise ConfigError("a turn must be non-empty text")
        return encode_conversation(self.model.tokenizer, [*self.turns, text], self.answers, chat=self.chat)

    def say(self, text: str, **options: Any) -> GenerationResult:
        """Answer ``text`` after the turns so far and remember both; ``options`` as :func:`generate`
        takes them (``max_new_tokens``, ``sampling``, ``stop``). A turn that fails is not remembered."""
        if "prefix_cache" in options or "chat" in options:
            raise ConfigError("a Conversation sets prefix_cache and chat itself; pass them to Conversation()")
        result = generate(self.model, self.prompt_ids(text), draft=self.draft, k=self.k, prefix_cache=self.cache,
                          **options)
        self.turns.append(text)
        self.answers.append(result.text)
        return result
