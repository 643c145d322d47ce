"""Prometheus metrics, named after vLLM's so its dashboards read them with the prefix changed.

Speculation (vLLM ``v1/spec_decode/metrics.py``), counted over the target passes that had a
proposal ("drafts"):

- ``draftwise:spec_decode_num_drafts`` - passes that verified at least one proposed token;
- ``draftwise:spec_decode_num_draft_tokens`` - tokens proposed;
- ``draftwise:spec_decode_num_accepted_tokens`` - of those, accepted;
- ``draftwise:spec_decode_num_accepted_tokens_per_pos{position}`` - accepted at draft position i.

Under ``--k auto`` on a batched server (the goodput policy, :mod:`draftwise.policy.batch`),
the k each decoding sequence goes with, every step: ``draftwise:spec_decode_chosen_k{draft}``, a
histogram (a scored tree's k is the nodes it keeps), and
``draftwise:spec_decode_num_plain_choices{draft}``, the steps it chose k = 0 (a plain step).

So the acceptance rate is ``accepted / draft_tokens`` and the mean acceptance length (bonus
token included) is ``1 + accepted / drafts``, as in vLLM. Counters are exported with prometheus'
``_total`` suffix (``draftwise:spec_decode_num_drafts_total``), as vLLM's are.

Prefix caching (vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits``, in tokens): with
``--prefix-cache-mb`` above 0, ``draftwise:prefix_cache_queries`` counts the prompt tokens looked
up and ``draftwise:prefix_cache_hits`` those whose K/V came from the cache (so the hit rate is
``hits / queries``); the gauge ``draftwise:prefix_cache_bytes`` is what the cache holds now
(at most the bound). Read from the cache when scraped.

Requests: ``draftwise:request_success{finished_reason}`` (stop, length, abort, timeout, error),
``draftwise:request_rejected{reason}`` (400, 401, 404, 413, 429), prompt and generation token
counters, and histograms of the time to first token (queue included), the gap between
successive streamed outputs (``inter_token_latency``; one speculative step can deliver several
tokens at once), end-to-end latency, queue time and each request's generation tokens/s. Gauges:
``num_requests_waiting`` (the queue depth) and ``num_requests_running``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from draftwise.core.stats import SpecStats

P = "draftwise:"
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_GAP = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_RATE = (1, 5, 10, 20, 30, 40, 50, 75, 100, 150, 200, 400, 800)


class ServerMetrics:
    """One registry per app (tests run several servers in one process)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # as vLLM does: no `_created` twin of every counter
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        lab = ["model_name"]
        self.num_drafts = Counter(P + "spec_decode_num_drafts", "Target passes that verified a proposal.",
                                  [*lab, "draft"], registry=r)
        self.num_draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                        [*lab, "draft"], registry=r)
        self.num_accepted = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                    [*lab, "draft"], registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted, by draft position.",
                                        [*lab, "draft", "position"], registry=r)
        self.chosen_k = Histogram(P + "spec_decode_chosen_k", "The k each sequence went with per step under "
                                  "the goodput policy (k auto at batch; 0: a plain step).", [*lab, "draft"],
                                  buckets=tuple(range(0, 9)), registry=r)
        self.plain_choices = Counter(P + "spec_decode_num_plain_choices", "Steps the goodput policy chose k = 0 "
                                     "for a sequence (plain decoding that step).", [*lab, "draft"], registry=r)
        self.success = Counter(P + "request_success", "Finished requests, by finish reason.",
                               [*lab, "finished_reason"], registry=r)
        self.rejected = Counter(P + "request_rejected", "Requests refused before they queued, by HTTP status.",
                                [*lab, "reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens prefilled.", lab, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Tokens generated.", lab, registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first output, queue included.",
                              lab, buckets=_LATENCY, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Gap between successive streamed outputs.",
                             lab, buckets=_GAP, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to last output.", lab,
                             buckets=_LATENCY, registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Time spent waiting in the queue.", lab,
                                    buckets=_LATENCY, registry=r)
        self.tokens_per_second = Histogram(P + "request_generation_tokens_per_second",
                                           "Each request's generated tokens / its generation time.", lab,
                                           buckets=_RATE, registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests in the queue (the queue depth).", lab,
                             registry=r)
        self.running = Gauge(P + "num_requests_running", "Requests being generated (the sequences in the "
                             "running batch).", lab, registry=r)
        self.batch_size = Histogram(P + "batch_size", "Sequences in each target pass.", lab,
                                    buckets=(1, 2, 4, 8, 12, 16, 24, 32, 64), registry=r)
        self.rows_per_pass = Histogram(P + "tokens_per_pass", "Rows (tokens) fed to each target pass: a plain "
                                       "step's 1, a chain's k + 1, a tree's nodes, prompt chunks.", lab,
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)

    def track_queue(self, waiting: Callable[[], float], running: Callable[[], float]) -> None:
        """Read the gauges from the worker when scraped (never stale)."""
        self.waiting.labels(self.model_name).set_function(waiting)
        self.running.labels(self.model_name).set_function(running)

    def track_prefix_cache(self, cache: Any) -> None:
        """Export ``cache``'s counters (a :class:`~draftwise.runtime.prefix_cache.PrefixCache`)."""
        self.registry.register(_PrefixCacheCollector(self.model_name, cache))

    def reject(self, status: int) -> None:
        self.rejected.labels(self.model_name, str(status)).inc()

    def observe_start(self, queue_s: float) -> None:
        self.queue_time.labels(self.model_name).observe(queue_s)

    def observe_first(self, ttft_s: float) -> None:
        self.ttft.labels(self.model_name).observe(ttft_s)

    def observe_pass(self, sequences: int, rows: int) -> None:
        """One batched target pass: how many sequences and rows it served."""
        self.batch_size.labels(self.model_name).observe(sequences)
        self.rows_per_pass.labels(self.model_name).observe(rows)

    def observe_k(self, draft: str, k: int) -> None:
        """One sequence's k for one step, as the goodput policy chose it."""
        self.chosen_k.labels(self.model_name, draft).observe(k)
        if k == 0:
            self.plain_choices.labels(self.model_name, draft).inc()

    def observe_gap(self, gap_s: float) -> None:
        self.itl.labels(self.model_name).observe(gap_s)

    def observe_end(
        self, *, reason: str, draft: str, prompt_tokens: int, new_tokens: int, e2e_s: float,
        generation_s: float, stats: SpecStats,
    ) -> None:
        """Account for one request that reached the worker (finished, cancelled or failed)."""
        m = self.model_name
        self.success.labels(m, reason).inc()
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(new_tokens)
        self.e2e.labels(m).observe(e2e_s)
        if new_tokens and generation_s > 0:
            self.tokens_per_second.labels(m).observe(new_tokens / generation_s)
        if stats.proposed:
            drafts = stats.tested_at[0] if stats.tested_at else 0  # every proposing pass tests position 0
            self.num_drafts.labels(m, draft).inc(drafts)
            self.num_draft_tokens.labels(m, draft).inc(stats.proposed)
            self.num_accepted.labels(m, draft).inc(stats.accepted)
            for pos, n in enumerate(stats.accepted_at):
                self.accepted_per_pos.labels(m, draft, str(pos)).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PrefixCacheCollector:
    """The prefix cache's counters and bytes, read when ``/metrics`` is scraped."""

    def __init__(self, model_name: str, cache: Any) -> None:
        self.model_name, self.cache = model_name, cache

    def describe(self) -> list[Metric]:  # the names, for the registry's duplicate check (read nothing)
        return [CounterMetricFamily(P + "prefix_cache_queries", ""), CounterMetricFamily(P + "prefix_cache_hits", ""),
                GaugeMetricFamily(P + "prefix_cache_bytes", "")]

    def collect(self) -> Iterator[Metric]:
        c, lab = self.cache, ["model_name"]
        for name, doc, value in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", c.queries),
            ("prefix_cache_hits", "Prompt tokens whose K/V came from the prefix cache (not prefilled).", c.hits),
        ):
            family = CounterMetricFamily(P + name, doc, labels=lab)
            family.add_metric([self.model_name], value)
            yield family
        held = GaugeMetricFamily(P + "prefix_cache_bytes", "Bytes of K/V the prefix cache holds now.", labels=lab)
        held.add_metric([self.model_name], c.bytes)
        yield held
