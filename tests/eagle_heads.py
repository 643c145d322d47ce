"""Draft heads for tests: a valid EAGLE head for a (tiny) target, saved in a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.drafter import fingerprint_of
from draftwise.eagle.files import save_head
from draftwise.eagle.head import EagleHead, HeadConfig


def head_folder(model: Any, folder: Path, *, arch: str, seed: int, copy_feature: bool = False) -> Path:
    """A valid head for ``model`` saved in ``folder``, random unless ``copy_feature`` (EAGLE-1
    only): then fc passes the feature half through, the MLP adds nothing (down_proj zero) and
    attention adds a little (o_proj std 0.01). Such a head mostly predicts the next feature
    equal to the last one, so on this model's repetitive output some of its proposals are
    accepted; and since its attention still counts, a head cache left from another prompt
    changes what it proposes (measured on the other prompt after this one: 7 of 118 proposals
    accepted with the cache reset at ``start``, 11 without the reset)."""
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.from_target(model.config, arch=arch))
    d = int(model.config.hidden_size)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
        if copy_feature:
            head.fc.weight.zero_()
            head.fc.weight[:, d:] = torch.eye(d)
            head.o_proj.weight.mul_(0.01 / 0.3)
            head.down_proj.weight.zero_()
    target = {"name": model.name, "fingerprint": fingerprint_of(model), "hidden_size": d,
              "vocab_size": int(model.runtime.vocab_size)}
    return save_head(folder, head.eval(), draft_tokens=None, target=target)
