"""Rules for the recipes' keys (``config/recipes.py``): each acts in the run that reads it, or is refused.

* a recipe key set away from its default in a run whose recipe does not read it is an error naming the recipe
  and its entry point;
* SPIN needs pairs (``rollout.n=2`` for reward pairs), a reference model it can refresh, and pair-shaped batches;
* PRIME needs its implicit PRM (``reward_model.enable=true``, a causal LM) and groups to take RLOO over;
* ``actor_rollout_ref.ref.model.path`` needs a run that uses a reference; ``trainer.ref_update_freq`` a reference
  that is a model of its own (not the LoRA actor with its adapter off).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.key_policy import default_of
from hybridflow.config.recipes import RECIPES

__all__ = ["check_recipes", "DPO_PAIRS", "PRIME_UPDATES"]

DPO_PAIRS = ("reward", "reference")
DPO_LOSS_TYPES = ("sigmoid", "ipo")
SPPO_SCOPES = ("batch", "group")
PRIME_UPDATES = ("none", "before", "after")
PRIME_GRANULARITIES = ("token", "whole")
PRIME_NORMS = ("batch_norm", "none")
ENTRY = {"spin": "python -m hybridflow.recipe.spin.main_spin", "sppo": "python -m hybridflow.recipe.sppo.main_sppo",
         "prime": "python -m hybridflow.recipe.prime.main_prime"}

# key -> the recipe that reads it (for SPPO also the estimator / loss of that name)
RECIPE_KEYS = {
    "actor_rollout_ref.actor.dpo_beta": "spin",
    "algorithm.dpo_loss_type": "spin",
    "algorithm.dpo_label_smoothing": "spin",
    "algorithm.dpo_pairs": "spin",
    "algorithm.dpo_reference_field": "spin",
    "actor_rollout_ref.actor.sppo_eta": "sppo",
    "algorithm.sppo_eta": "sppo",
    "algorithm.sppo_softmean_scope": "sppo",
    "algorithm.reward_gt_coef": "prime",
    "algorithm.reward_dpo_coef": "prime",
    "reward_model.model.ref_path": "prime",
    "reward_model.model.ref_type": "prime",
    "reward_model.model.update": "prime",
    "reward_model.model.beta_train": "prime",
    "reward_model.model.loss_type": "prime",
    "reward_model.model.tokenizer_path": "prime",
    "reward_model.model.enable_gradient_checkpointing": "prime",
    "reward_model.prime_granularity": "prime",
    "reward_model.prime_norm": "prime",
    "data.filter_accuracy": "prime",
    "data.accuracy_lower_bound": "prime",
    "data.accuracy_upper_bound": "prime",
    "data.oversample_factor": "prime",
    "data.filter_truncate": "prime",
}
PRIME_OPTIM_KEYS = ("lr", "lr_warmup_steps_ratio", "lr_warmup_steps", "weight_decay", "betas", "clip_grad",
                    "min_lr_ratio", "num_cycles", "lr_scheduler_type", "warmup_style", "grad_clip")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def _reads(cfg: Any, recipe: str, key: str) -> bool:
    if cfg.trainer.recipe == recipe:
        return True
    if recipe == "sppo":  # the estimator and the loss also run on their own
        if key.startswith("algorithm."):
            return cfg.algorithm.adv_estimator == "sppo"
        return cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "sppo"
    return False


def check_recipes(cfg: Any, errors: list[str], notes: list[str]) -> None:
    """Append the errors (and notes) of the recipe keys of ``cfg``."""
    recipe = cfg.trainer.recipe
    if recipe is not None and recipe not in RECIPES:
        errors.append(f"trainer.recipe={recipe!r}: choose null (PPO and its variants) or one of {', '.join(RECIPES)}")
        return
    for key, owner in RECIPE_KEYS.items():
        if _get(cfg, key) != default_of(key) and not _reads(cfg, owner, key):
            errors.append(f"{key}={_get(cfg, key)!r} is only read by the {owner.upper()} recipe: run it with "
                          f"{ENTRY[owner]} (trainer.recipe={owner}), or drop the key")
    for name in PRIME_OPTIM_KEYS:
        key = f"reward_model.model.optim.{name}"
        if _get(cfg, key) != default_of(key) and recipe != "prime":
            errors.append(f"{key} trains PRIME's implicit reward model and is only read by {ENTRY['prime']}")
    _check_reference(cfg, errors)
    if recipe == "spin":
        _check_spin(cfg, errors)
    if recipe == "sppo" or cfg.algorithm.adv_estimator == "sppo":
        _check_sppo(cfg, errors)
    if recipe == "prime":
        _check_prime(cfg, errors)
    _check_dapo_overlong(cfg, errors)


def _check_dapo_overlong(cfg: Any, errors: list[str]) -> None:
    """DAPO's overlong buffer (reward_manager=dapo): ``len`` tokens before the response cap where the penalty ramps
    up, so 0 < len <= max_resp_len (reward_kwargs.max_resp_len, else data.max_response_length) -- the manager
    would refuse it only when it is built, after the workers started."""
    kwargs = dict(cfg.reward_model.reward_kwargs or {})
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    if cfg.reward_model.reward_manager != "dapo" or not isinstance(buffer, dict) or not buffer.get("enable"):
        return
    cap = kwargs.get("max_resp_len") or cfg.data.max_response_length
    length = buffer.get("len")
    if not isinstance(length, (int, float)) or not 0 < length <= cap:
        where = "reward_model.reward_kwargs.max_resp_len" if kwargs.get("max_resp_len") else "data.max_response_length"
        errors.append(f"reward_model.reward_kwargs.overlong_buffer_cfg.len={length!r} must be in (0, {cap}] ({where}="
                      f"{cap}): the penalty ramps up over the last len tokens before the response cap; lower it "
                      f"(e.g. overlong_buffer_cfg.len={max(1, int(cap) // 4)}; verl 0.9's spelling: "
                      "reward.reward_kwargs.overlong_buffer_cfg.len, the first recipe's: reward_model.overlong_buffer.len)")


def _check_reference(cfg: Any, errors: list[str]) -> None:
    ref_model = cfg.actor_rollout_ref.ref.model
    if ref_model is not None:
        if not isinstance(ref_model, dict) or not ref_model.get("path"):
            errors.append(f"actor_rollout_ref.ref.model={ref_model!r}: give the reference's checkpoint as "
                          "actor_rollout_ref.ref.model.path=DIR (a Hugging Face folder or hub name)")
        else:
            unknown = sorted(set(ref_model) - {"path", "trust_remote_code", "override_config"})
            if unknown:
                errors.append(f"actor_rollout_ref.ref.model has unknown keys {unknown}: it takes path, "
                              "trust_remote_code and override_config")
        if not cfg.use_reference_policy:
            errors.append("actor_rollout_ref.ref.model.path is set but this run uses no reference policy: it is read "
                          "with actor.use_kl_loss=true, algorithm.use_kl_in_reward=true or trainer.recipe=spin")
    if cfg.trainer.log_freq < 1:
        errors.append(f"trainer.log_freq={cfg.trainer.log_freq} must be >= 1 (steps between two logged steps)")
    freq = cfg.trainer.ref_update_freq
    if freq > 0:
        if not cfg.use_reference_policy:
            errors.append(f"trainer.ref_update_freq={freq} refreshes the reference policy, but this run uses none "
                          "(set actor.use_kl_loss=true, algorithm.use_kl_in_reward=true or trainer.recipe=spin)")
        lora = int(cfg.actor_rollout_ref.model.lora_rank) > 0 or cfg.actor_rollout_ref.model.lora_adapter_path
        if lora and ref_model is None:
            errors.append(f"trainer.ref_update_freq={freq} with a LoRA actor: its reference is the actor with the "
                          "adapter disabled, which has no weights of its own to refresh; give the reference its own "
                          "model (actor_rollout_ref.ref.model.path) or set trainer.ref_update_freq=-1")


def _check_spin(cfg: Any, errors: list[str]) -> None:
    algo, arr = cfg.algorithm, cfg.actor_rollout_ref
    actor, n = arr.actor, int(arr.rollout.n)
    if algo.dpo_pairs not in DPO_PAIRS:
        errors.append(f"algorithm.dpo_pairs={algo.dpo_pairs!r}: choose reward (two samples per prompt, the better one "
                      "chosen; verl-recipe) or reference (the dataset's answer chosen over each sample; SPIN's paper)")
    if algo.dpo_loss_type not in DPO_LOSS_TYPES:
        errors.append(f"algorithm.dpo_loss_type={algo.dpo_loss_type!r}: choose one of {', '.join(DPO_LOSS_TYPES)}")
    if actor.dpo_beta <= 0:
        errors.append(f"actor_rollout_ref.actor.dpo_beta={actor.dpo_beta} must be > 0")
    if not 0.0 <= algo.dpo_label_smoothing < 0.5:
        errors.append(f"algorithm.dpo_label_smoothing={algo.dpo_label_smoothing} must be in [0, 0.5)")
    if algo.dpo_pairs == "reward" and n != 2:
        errors.append(f"trainer.recipe=spin with algorithm.dpo_pairs=reward pairs the two samples of each prompt: set "
                      f"actor_rollout_ref.rollout.n=2 (it is {n})")
    field = algo.dpo_reference_field
    if algo.dpo_pairs == "reference" and not (field == "reward_model.ground_truth" or field.startswith("extra_info.")):
        errors.append(f"algorithm.dpo_reference_field={field!r}: give reward_model.ground_truth or extra_info.<key>")
    if cfg.critic.enable:
        errors.append("critic.enable=true with trainer.recipe=spin: SPIN's DPO update trains no critic")
    if not actor.use_dynamic_bsz and actor.ppo_micro_batch_size_per_gpu and actor.ppo_micro_batch_size_per_gpu % 2:
        errors.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={actor.ppo_micro_batch_size_per_gpu}: "
                      "SPIN's micro-batches hold whole (chosen, rejected) pairs; use an even number")
    if cfg.algorithm.use_kl_in_reward:
        errors.append("algorithm.use_kl_in_reward=true with trainer.recipe=spin: the DPO loss already measures the "
                      "policy against its reference; drop use_kl_in_reward")


def _check_sppo(cfg: Any, errors: list[str]) -> None:
    if cfg.algorithm.sppo_softmean_scope not in SPPO_SCOPES:
        errors.append(f"algorithm.sppo_softmean_scope={cfg.algorithm.sppo_softmean_scope!r}: choose batch (verl-recipe: "
                      "one soft mean over the step's rewards) or group (per prompt)")
    if cfg.trainer.recipe == "sppo":
        loss = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
        if cfg.algorithm.adv_estimator != "sppo" or loss != "sppo":
            errors.append(f"trainer.recipe=sppo trains the SPPO regression: it needs algorithm.adv_estimator=sppo and "
                          f"actor.policy_loss.loss_mode=sppo (got {cfg.algorithm.adv_estimator!r} and {loss!r})")


def _check_prime(cfg: Any, errors: list[str]) -> None:
    rm, data = cfg.reward_model, cfg.data
    if not rm.enable:
        errors.append("trainer.recipe=prime scores with its implicit process reward model: set reward_model.enable=true "
                      "and reward_model.model.path to a causal LM (usually the policy's own checkpoint)")
    if rm.model.update not in PRIME_UPDATES:
        errors.append(f"reward_model.model.update={rm.model.update!r}: choose one of {', '.join(PRIME_UPDATES)} "
                      "(verl-recipe's 'reverse' feeds the dpo/bon losses, which are not built)")
    if rm.model.loss_type != "ce":
        errors.append(f"reward_model.model.loss_type={rm.model.loss_type!r}: only ce (PRIME's cross-entropy on the "
                      "outcome labels) is built; verl-recipe's dpo / bon_acc / bon_rm need its 'reverse' update")
    if rm.model.ref_type != "freeze":
        errors.append(f"reward_model.model.ref_type={rm.model.ref_type!r}: the implicit PRM's reference is frozen "
                      "(freeze), as in verl-recipe")
    if rm.prime_granularity not in PRIME_GRANULARITIES:
        errors.append(f"reward_model.prime_granularity={rm.prime_granularity!r}: choose token or whole")
    if rm.prime_norm not in PRIME_NORMS:
        errors.append(f"reward_model.prime_norm={rm.prime_norm!r}: choose batch_norm or none")
    if rm.model.beta_train <= 0:
        errors.append(f"reward_model.model.beta_train={rm.model.beta_train} must be > 0")
    if cfg.algorithm.adv_estimator not in ("rloo", "prime"):
        errors.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} with trainer.recipe=prime: PRIME's "
                      "advantage is its two-source RLOO (verl-recipe writes rloo); use rloo or prime")
    if int(cfg.actor_rollout_ref.rollout.n) < 2:
        errors.append("trainer.recipe=prime takes leave-one-out baselines over each prompt's samples: set "
                      "actor_rollout_ref.rollout.n >= 2")
    if data.oversample_factor < 1.0:
        errors.append(f"data.oversample_factor={data.oversample_factor} must be >= 1 (prompts drawn per kept prompt)")
    if not 0.0 <= data.accuracy_lower_bound <= data.accuracy_upper_bound <= 1.0:
        errors.append(f"data.accuracy_lower_bound={data.accuracy_lower_bound} and accuracy_upper_bound="
                      f"{data.accuracy_upper_bound} must satisfy 0 <= lower <= upper <= 1")
    if cfg.critic.enable:
        errors.append("critic.enable=true with trainer.recipe=prime: PRIME's advantage needs no critic")
    if rm.mini_batch_size <= 0:
        errors.append(f"reward_model.mini_batch_size={rm.mini_batch_size} must be a positive number of prompts")
    drawn = int(round(data.train_batch_size * data.oversample_factor))
    if data.gen_batch_size in (data.train_batch_size, drawn):  # the loader draws the over-sampled batch
        data.gen_batch_size = drawn
    else:
        errors.append(f"data.gen_batch_size={data.gen_batch_size} with trainer.recipe=prime: PRIME draws "
                      f"data.train_batch_size x data.oversample_factor = {drawn} prompts per step; drop gen_batch_size")
    if rm.launch_reward_fn_async:
        errors.append("reward_model.launch_reward_fn_async=true with trainer.recipe=prime: PRIME filters the prompts by "
                      "their scores right after generation, so scoring cannot run in the background")
    if cfg.algorithm.filter_groups.enable:
        errors.append("algorithm.filter_groups.enable=true with trainer.recipe=prime: PRIME filters prompts by accuracy "
                      "itself (data.filter_accuracy); use one or the other")
