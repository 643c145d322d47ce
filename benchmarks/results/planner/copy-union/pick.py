"""A prototype for the offline replay only (`replay.py`): propose, per request, with whichever
copy draft (suffix decoding or prompt lookup) has matched more of the committed tokens so far.
Both propose every step (each costs ~nothing); the idle one's proposal is scored against what
was committed (censored at the committed length). Lookup's chain is scored by its own decayed
per-depth acceptance, so that `--k auto`'s trim prices it as it prices suffix's tree.

Options: mode=request (counts start again each request) or session (kept across requests, with
`decay` per step); margin (lookup must lead by this fraction); warm (steps on suffix first)."""
from draftwise.cost.replay import accepted_along
from draftwise.drafters.base import Capabilities, Draft
from draftwise.tree import TokenTree
from draftwise.drafters.lookup import PromptLookupDrafter
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import DraftSpec
from union import count_chain  # replay.py puts this folder on the path


class Pick:
    name = "copy"

    def __init__(self, mode="request", decay=1.0, margin=0.0, warm=0):
        self.s = make_drafter(DraftSpec.parse("suffix"), None)
        self.l = PromptLookupDrafter()
        self.capabilities = Capabilities(trees=True, scored=True, learns=self.s.capabilities.learns, replay="exact", cost="host")
        self.decay, self.margin, self.warm = decay, margin, warm
        self.mode = mode
        self.hit = [0.5] * 16; self.tot = [1.0] * 16
        self.cs = self.cl = 0.0  # tokens each draft's proposals matched (this request, or decayed)

    def start(self, prompt, sampling, generator):
        self.s.start(prompt, sampling, generator); self.l.start(prompt, sampling, generator)
        self.last = None; self.ctx_len = 0
        if self.mode == "request":
            self.cs = self.cl = 0.0
        self.steps = 0

    def _learn(self, context):
        if self.last is None:
            return
        committed = context[self.ctx_len:]
        sd, ld = self.last
        self.cs = self.cs * self.decay + (accepted_along(sd, committed) if sd.tokens else 0)
        self.cl = self.cl * self.decay + (accepted_along(ld, committed) if ld.tokens else 0)
        count_chain(self.hit, self.tot, ld.tokens, committed, 0.9)  # lookup's own per-depth acceptance

    def propose(self, context, k):
        self._learn(context)
        sd = self.s.propose(context, k)
        ld = self.l.propose(context, k)
        self.last, self.ctx_len = (sd, ld), len(context)
        self.steps += 1
        use_l = self.cl > self.cs * (1 + self.margin) and self.steps > self.warm
        if use_l and ld.tokens:
            p, scores = 1.0, []
            for d in range(len(ld.tokens)):
                p *= self.hit[d] / self.tot[d]
                scores.append(p)
            return Draft(ld.tokens, None, TokenTree.chain(ld.tokens), tuple(scores))
        return sd if sd.tokens else ld

    def observe(self, n):
        pass

    def end(self, output):
        self.s.end(output); self.l.end(output)
