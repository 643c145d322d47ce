"""The public entry points: :func:`generate` and :func:`stream` with every option, ``k="auto"``
included. The bench, the server and the CLI call these, never the core loop directly.

They are :func:`draftwise.core.decode.generate` / :func:`draftwise.core.decode.stream` (the core loop,
which takes a number or a :class:`~draftwise.core.kpolicy.KPolicy`) plus one thing the core must not
know: ``k="auto"`` builds the adaptive policy from this machine's measured profile
(:func:`draftwise.planner.route.policy_for`, which measures and caches one on first use).

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
from draftwise.runtime.loaders import Model, load_model
from draftwise.threads import share_cores

KArg = int | Literal["auto"] | KPolicy


def share_cores_while_decoding(enabled: bool = True) -> None:
    """Opt in (or out) to sharing this machine's cores with other draftwise processes while
    decoding: before each target pass, at most twice a second, this process uses ``cores //
    processes decoding`` threads (:func:`draftwise.threads.share_cores`). The CLI and the server
    turn it on; a library call never does."""
    (decode.add_step_hook if enabled else decode.remove_step_hook)(share_cores)


def _policy(model: Model, draft: Drafter | DraftSpec | str | None, k: KArg) -> int | KPolicy:
    if k == "auto" and isinstance(draft, Drafter):
        raise ConfigError(
            f"k='auto' needs a draft spec (e.g. draft='lookup'), not a drafter object ({draft.name}): "
            "the profile is keyed by spec"
        )
    return policy_for(model, draft, k)  # type: ignore[arg-type]


def stream(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    draft: Drafter | DraftSpec | str | None = None,
    k: KArg = 4,
    **options: Any,
) -> Stream:
    """Start a generation and return a :class:`~draftwise.core.decode.Stream` of text pieces.

    ``prompt`` is text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as they are. ``draft`` is a drafter object or a
    spec: ``"none"``, ``"lookup"``, ``"self"``, ``"model:PATH"`` (see
    :class:`draftwise.drafters.DraftSpec`); ``k`` is how many tokens it proposes per step, or
    ``"auto"`` to choose k (or no speculation) every step from the machine profile and the
    acceptance seen so far (:mod:`draftwise.policy.adaptive`). The other options
    (``max_new_tokens=128``, ``sampling``, ``stop``, ``chat``) are those of
    :func:`draftwise.core.decode.stream`.
    """
    if isinstance(model, str):
        model = load_model(model)
    policy = _policy(model, draft, k)
    return decode.stream(model, prompt, draft=make_drafter(draft, model), k=policy, **options)


def generate(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    draft: Drafter | DraftSpec | str | None = None,
    k: KArg = 4,
    **options: Any,
) -> GenerationResult:
    """Generate a completion of ``prompt``; see :func:`stream` for the arguments.

    The output is exactly what plain decoding of the target gives (greedy: token for token;
    sampling: in distribution), whatever the draft; the draft only changes the speed.
    """
    if isinstance(model, str):
        model = load_model(model)
    policy = _policy(model, draft, k)
    return decode.generate(model, prompt, draft=make_drafter(draft, model), k=policy, **options)
