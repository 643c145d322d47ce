"""A prototype: suffix decoding and prompt lookup in one draft, for the offline replay only
(`replay.py`). Modes:

- calib (default): suffix's scored tree with lookup's chain merged in (the hybrid's
  merge_chain), each lookup node scored by lookup's own acceptance at that depth, estimated
  online with decaying counts on every step's lookup chain against the tokens committed next;
- fixed: lookup's nodes scored prior, prior^2, ... instead;
- choose: propose one or the other, whichever expects more accepted tokens (suffix's score
  times its own online calibration, against lookup's estimate);
- suffix_first: suffix's tree, lookup's chain only where suffix has nothing.
"""
from draftwise.drafters.base import Capabilities, Draft
from draftwise.drafters.hybrid import merge_chain
from draftwise.drafters.lookup import PromptLookupDrafter
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import DraftSpec
from draftwise.tree import TokenTree


def count_chain(hit, tot, chain, committed, decay):
    """Decayed per-depth counts of a chain's tokens against the committed ones: depth d is
    tested when every earlier one matched, and censored past the committed length."""
    for d, t in enumerate(chain):
        if d >= len(committed):
            break  # censored
        tot[d] = tot[d] * decay + 1
        ok = committed[d] == t
        hit[d] = hit[d] * decay + ok
        if not ok:
            break


class Union:
    """suffix's scored tree with lookup's chain merged in; lookup nodes scored by an online
    per-depth acceptance estimate of lookup (counted on its own chain every step, censored at
    the committed length)."""

    name = "copy"

    def __init__(self, mode="calib", decay=0.9, prior=0.5, suffix="suffix"):
        self.s = make_drafter(DraftSpec.parse(suffix), None)
        self.l = PromptLookupDrafter()
        self.mode, self.decay = mode, decay
        self.capabilities = Capabilities(trees=True, scored=True, learns=self.s.capabilities.learns, replay="exact", cost="host")
        self.prior = prior
        self.hit = [prior] * 16; self.tot = [1.0] * 16
        self.chain = []; self.ctx_len = 0
        self.sacc, self.sscore = 1.0, 1.0; self.last_s = None

    def start(self, prompt, sampling, generator):
        self.s.start(prompt, sampling, generator); self.l.start(prompt, sampling, generator)
        self.chain = []

    def _learn_s(self, context):
        from draftwise.cost.replay import accepted_along
        if self.last_s is None or not self.last_s.tokens:
            return
        committed = context[self.ctx_len:]
        acc = accepted_along(self.last_s, committed)
        self.sacc = self.sacc * self.decay + acc
        self.sscore = self.sscore * self.decay + sum(self.last_s.scores or ())

    def _learn(self, context):
        self._learn_s(context)
        # how far did last step's lookup chain match the committed tokens?
        if not self.chain:
            return
        count_chain(self.hit, self.tot, self.chain, context[self.ctx_len:], self.decay)

    def propose(self, context, k):
        self._learn(context)
        sd = self.s.propose(context, k)
        ld = self.l.propose(context, k)
        self.chain, self.ctx_len = list(ld.tokens), len(context)
        if not ld.tokens:
            return sd
        self.last_s = sd
        if self.mode == "suffix_first" and sd.tokens:
            return sd
        p, scores = 1.0, []
        for d in range(len(ld.tokens)):
            p *= self.hit[d] / self.tot[d] if self.mode in ("calib", "choose") else self.prior
            scores.append(p)
        if self.mode == "choose" and sd.tokens:
            es = sum(sd.scores or ()) * self.sacc / self.sscore
            el = sum(scores)
            return sd if es >= el else Draft(ld.tokens, None, TokenTree.chain(ld.tokens), tuple(scores))
        if not sd.tokens:
            return Draft(ld.tokens, None, TokenTree.chain(ld.tokens), tuple(scores))
        base = sd if sd.tree is not None else Draft(sd.tokens, None, TokenTree.chain(sd.tokens), sd.scores)
        return merge_chain(base, ld.tokens, scores).prefix(k)

    def observe(self, n):
        pass

    def end(self, output):
        self.s.end(output); self.l.end(output)
