"""Model-based reward: a sequence-classification RM scores each (prompt, response) pair.

The RM's scalar output at the last attended token is the reward (the Bradley-Terry reward model of
Ouyang et al. 2022, arXiv:2203.02155).  It is placed on the last valid response token of an (B, R)
``rm_scores`` tensor, the shape ``token_level_scores`` takes, so the trainer can add it to rule-based
scores.  When the RM was trained with another tokenizer / chat template than the policy, each pair
is decoded to text and re-rendered with the RM's own chat template before scoring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hybridflow.controller import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register
from hybridflow.engine.forward import last_token_scores
from hybridflow.engine.model_loader import load_reward_model, load_tokenizer
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.protocol import DataProto
from hybridflow.workers.micro_batching import MicroBatchSpec, gather_in_order, split_micro_batches

if TYPE_CHECKING:
    from hybridflow.config.schema import RewardModelConfig

__all__ = ["RewardModelWorker", "place_on_last_token", "same_tokenizer"]


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) scores -> (B, R) zeros with each score at the row's last valid response token."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.long().sum(-1)
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(len(scores))
    out[rows, last] = scores.float() * (lengths > 0).float()
    return out


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids (so the policy's ids can be fed as they are)."""
    if a is b:
        return True
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


class RewardModelWorker(Worker):
    """``RewardModelWorker(config: RewardModelConfig)``: ``init_model`` and ``compute_rm_score``."""

    def __init__(self, config: RewardModelConfig):
        super().__init__()
        self.config = config
        self._dims = ParallelDims(self.world_size, sp=config.ulysses_sequence_parallel_size,
                                  key="reward_model.ulysses_sequence_parallel_size")
        self._register_dispatch_collect_info("reward_model", dp_rank=self._dims.dp_rank(self.rank),
                                             is_collect=self._dims.is_collect(self.rank))
        self.engine: TrainEngine | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> None:
        """Load the frozen RM (``total_training_steps`` is the trainer's common call: the RM has no schedule)."""
        if self.world_size > 1:  # joined here: every rank exists once init_model runs
            self.init_distributed()
        mc = self.config.model
        if mc.external_lib:
            from hybridflow.utils.load_object import import_source

            import_source(mc.external_lib, key="reward_model.model.external_lib")
        self.rm_tokenizer = load_tokenizer(mc.path, mc.trust_remote_code, require_chat_template=False,
                                           field="reward_model.model.path")
        self.input_tokenizer = load_tokenizer(mc.input_tokenizer or mc.path, mc.trust_remote_code,
                                              require_chat_template=False, field="reward_model.model.input_tokenizer")
        self.retokenize = not same_tokenizer(self.input_tokenizer, self.rm_tokenizer)
        if self.retokenize and not self.rm_tokenizer.chat_template:
            raise ValueError(
                f"the reward model at {mc.path!r} uses a different tokenizer than the policy, so pairs are re-rendered "
                "with the RM's chat template -- but its tokenizer has none; use an RM checkpoint with a chat template"
            )
        module = load_reward_model(mc.path, mc.fsdp_config.model_dtype, mc.trust_remote_code, mc.override_config)
        module.requires_grad_(False)
        self.engine = TrainEngine(module, mc.fsdp_config, None, role="reward_model", parallel_dims=self._dims)

    def _rm_inputs(self, data: DataProto) -> DataProto:
        """The RM's own ``input_ids/attention_mask/position_ids`` (re-rendered chats when tokenizers differ)."""
        b = data.batch
        if not self.retokenize:
            return DataProto.from_dict({k: b[k] for k in ("input_ids", "attention_mask", "position_ids")})
        tok = self.rm_tokenizer
        texts = []
        for i in range(len(data)):
            mask = b["response_mask"][i].bool()
            response = self.input_tokenizer.decode(b["responses"][i][mask], skip_special_tokens=True)
            chat = self._prompt_messages(data, i) + [{"role": "assistant", "content": response}]
            texts.append(tok.apply_chat_template(chat, tokenize=False))
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False, padding_side="right",
                  truncation=self.config.max_length is not None, max_length=self.config.max_length)
        attention_mask = enc["attention_mask"]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": attention_mask,
                                    "position_ids": position_ids})

    def _prompt_messages(self, data: DataProto, i: int) -> list[dict]:
        if "raw_prompt" in data.non_tensor_batch:
            return list(data.non_tensor_batch["raw_prompt"][i])
        b = data.batch
        P = b["prompts"].shape[1]
        prompt = b["prompts"][i][b["attention_mask"][i][:P].bool()]
        return [{"role": "user", "content": self.input_tokenizer.decode(prompt, skip_special_tokens=True)}]

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reward_model"))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the RM score at each row's last response token, 0 elsewhere."""
        inputs = self._rm_inputs(data)
        # micro_batch_size_per_gpu unset (verl's default null) scores the rank's rows in one pass
        spec = MicroBatchSpec(
            bool(self.config.use_dynamic_bsz), self.config.micro_batch_size_per_gpu or len(inputs),
            int(self.config.forward_max_token_len_per_gpu), "reward_model.micro_batch_size_per_gpu",
        )
        micro_batches, parts = split_micro_batches(inputs, spec, sp=self._dims.sp)
        module = self.engine.module
        module.eval()
        scores = []
        with torch.no_grad(), self.engine.on_device(), self.engine.autocast():
            for mb in micro_batches:
                b = mb.batch.to(self.engine.device)
                scores.append(last_token_scores(module, b["input_ids"], b["attention_mask"], b["position_ids"],
                                                bool(self.config.model.use_remove_padding),
                                                sequence_parallel=self.engine.sequence_parallel).cpu())
        score = gather_in_order(scores, parts)
        return DataProto.from_dict({"rm_scores": place_on_last_token(score, data.batch["response_mask"])})
