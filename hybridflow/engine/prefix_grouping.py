"""Shared-prefix grouping (``actor_rollout_ref.actor.use_prefix_grouper``): a prompt's samples share one forward
of the prompt.

With ``rollout.n`` samples per prompt, the ordinary forward runs every prompt token n times -- once per row.
Grouped, the rows of a micro-batch whose prompts are equal (same tokens at the same positions) become one
sequence::

    [prompt[:-1] | prompt[-1] resp_1 | prompt[-1] resp_2 | ... ]

laid end to end (all groups of the micro-batch in one row), with an additive 4-D attention mask: a prefix token
sees the prefix before it; a token of sample k sees the prefix and the tokens of sample k before it, nothing of
the other samples.  Every token keeps its position id from the ordinary layout, so each response token attends to
exactly the keys, at exactly the positions, it attends to in its own row: the log-probs are the ungrouped ones
(up to float summation order) and so are the gradients, the shared prefix collecting the sum of its samples'.

The prompt's last token is repeated at the head of each sample segment because its output predicts the
sample's first token, which differs between samples; the copy sees the prefix and itself, as the original does.
The work saved is (n - 1) x (prompt length - 1) tokens of every layer per group; the dense mask costs
O(N^2) in attention for the N tokens of the micro-batch, as the packed layout does without varlen kernels.

Needs a model that takes additive masks (sdpa or eager attention); sliding-window layers get their windows in
the mask (positions as above).  Not for vision-language rows (equal prompt tokens do not mean equal images) or
Ulysses sequence parallelism (the config checks refuse both combinations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from hybridflow.engine.transformers_adapter import attention_implementation, attention_mask_layout

__all__ = ["PrefixGroups", "group_rows", "grouped_response_outputs"]

_ADDITIVE_MASK_ATTENTION = ("sdpa", "eager")


@dataclass
class PrefixGroups:
    """One packed row of the micro-batch's groups and where each response token's output lands.

    ``ids``/``pos`` (1, N); ``segment`` (N,) 0 for a prefix token, s > 0 for the tokens of segment s, -1 never;
    ``group`` (N,) the group of each token; ``keep`` (K,) the packed positions whose outputs are wanted and
    ``labels`` (1, K) the token each predicts; ``rows``/``cols`` (K,) where output k goes in the (B, R) result.
    """

    ids: torch.Tensor
    pos: torch.Tensor
    segment: torch.Tensor
    group: torch.Tensor
    keep: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    n_groups: int

    def attention_allowed(self) -> torch.Tensor:
        """(N, N) bool: query i may see key j (causal, same group, and j in the prefix or in i's segment)."""
        n = self.ids.shape[1]
        idx = torch.arange(n, device=self.ids.device)
        causal = idx[None, :] <= idx[:, None]
        same_group = self.group[:, None] == self.group[None, :]
        seg_q, seg_k = self.segment[:, None], self.segment[None, :]
        return causal & same_group & ((seg_k == 0) | (seg_k == seg_q))


def group_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               response_len: int) -> PrefixGroups:
    """Group the rows ``[left pad | prompt | response | right pad]`` of a micro-batch by equal prompts."""
    if position_ids.dim() != 2:
        raise ValueError("prefix grouping (actor.use_prefix_grouper) takes text rows with (B, L) position ids; "
                         "vision-language rows (M-RoPE positions) are not grouped")
    B, L = input_ids.shape
    P = L - response_len
    mask = attention_mask.bool()
    by_prompt: dict[tuple, list[int]] = {}
    for b in range(B):
        prompt_cols = mask[b, :P]
        key = (tuple(input_ids[b, :P][prompt_cols].tolist()), tuple(position_ids[b, :P][prompt_cols].tolist()))
        by_prompt.setdefault(key, []).append(b)
    ids, pos, seg, grp, keep, labels, rows, cols = [], [], [], [], [], [], [], []
    at = 0
    for g, ((prompt, prompt_pos), members) in enumerate(by_prompt.items()):
        if not prompt:
            raise ValueError(f"prefix grouping: row {members[0]} has no prompt token")
        head = len(prompt) - 1
        ids += prompt[:head]
        pos += prompt_pos[:head]
        seg += [0] * head
        grp += [g] * head
        at += head
        for s, b in enumerate(members, start=1):
            resp_cols = mask[b, P:].nonzero().flatten()
            resp = input_ids[b, P:][resp_cols].tolist()
            ids += [prompt[-1]] + resp
            pos += [prompt_pos[-1]] + position_ids[b, P:][resp_cols].tolist()
            seg += [s] * (len(resp) + 1)
            grp += [g] * (len(resp) + 1)
            # the output at the prompt's last token and at each response token but the last predicts a token of it
            keep += range(at, at + len(resp))
            labels += resp
            rows += [b] * len(resp)
            cols += resp_cols.tolist()
            at += len(resp) + 1
    dev = input_ids.device

    def t(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=dev)

    return PrefixGroups(ids=t(ids)[None], pos=t(pos)[None], segment=t(seg), group=t(grp), keep=t(keep),
                        labels=t(labels)[None], rows=t(rows), cols=t(cols), n_groups=len(by_prompt))


def _additive_masks(module: nn.Module, groups: PrefixGroups):
    """The model's 4-D additive mask(s) for the packed groups (each sliding-window layer type its own)."""
    config = getattr(module, "config", None)
    impl = attention_implementation(config) if config is not None else "sdpa"
    if impl not in _ADDITIVE_MASK_ATTENTION:
        raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper=true needs sdpa or eager attention (the groups "
                         f"are separated by an explicit attention mask); this model runs {impl!r}: set "
                         "actor_rollout_ref.actor.use_prefix_grouper=false, or load the model with sdpa "
                         "(+actor_rollout_ref.model.override_config.attn_implementation=sdpa)")
    layout = attention_mask_layout(config)
    if layout.unsupported:
        raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper=true: this model's layers cannot take an "
                         f"additive mask ({layout.unsupported}); set use_prefix_grouper=false")
    allowed = groups.attention_allowed()
    pos = groups.pos[0]

    def build(window: int | None) -> torch.Tensor:
        ok = allowed if window is None else allowed & (pos[:, None] - pos[None, :] < window)
        return torch.zeros(ok.shape, dtype=torch.float32, device=ok.device).masked_fill_(~ok, float("-inf"))[None, None]

    masks = {name: build(window) for name, window in layout.windows.items()}
    if layout.keyed:
        return masks
    (only,) = masks.values()
    return only


def grouped_response_outputs(module: nn.Module, batch: dict[str, torch.Tensor], head_fn: Callable) -> dict[str, torch.Tensor]:
    """Per response token (B, R) outputs of ``head_fn`` (``engine.forward``'s head protocol) from the grouped
    forward; positions past a row's response are 0."""
    R = batch["responses"].shape[-1]
    groups = group_rows(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R)
    B = batch["input_ids"].shape[0]
    outs = head_fn(module, groups.ids, _additive_masks(module, groups), groups.pos, groups.keep, groups.labels)
    full = {}
    for name, value in outs.items():
        buf = value.new_zeros((B, R) + tuple(value.shape[2:]))
        buf[groups.rows, groups.cols] = value[0]
        full[name] = buf
    return full
