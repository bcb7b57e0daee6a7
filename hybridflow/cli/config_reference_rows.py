"""The rows of the config reference: per section of ``docs/config.md``, the keys, their documented default and what
they do here. One source for two outputs: the key tables of ``docs/config.md`` (written by
``python -m hybridflow.cli.config_reference --write``; ``tests/cli/test_help.py`` keeps them equal) and
``hybridflow train --help NODE`` (the first sentence of a key's row is its line). Edit here, then regenerate.

The rollout's and reward model's sections live in ``config_reference_rollout_rows.py``; the row types in
``config_row.py``. A row's keys are relative to its section's node; a bare name after a dotted one is that key's sibling
(``optim.lr``, ``weight_decay`` = ``optim.lr``, ``optim.weight_decay``); ``{a,b}`` expands; ``x.*`` is the subtree.
"""

from __future__ import annotations

from hybridflow.cli.config_reference_rollout_rows import ROLLOUT_SECTIONS
from hybridflow.cli.config_row import Row, Section

__all__ = ["Row", "SECTIONS", "Section"]


SECTIONS: tuple[Section, ...] = (
    Section('data', 'data', (
        Row("`train_files`, `val_files`",
            "`~/data/rlhf/gsm8k/{train,test}.parquet`",
            "verl-format parquet (a path or a list)."),
        Row("`train_max_samples`, `val_max_samples`",
            "-1",
            "keep only the first N rows (-1 = all)."),
        Row("`prompt_key`",
            "`prompt`",
            "column holding the chat messages."),
        Row("`reward_fn_key`",
            "`data_source`",
            "column whose value picks the scoring function."),
        Row("`max_prompt_length`, `max_response_length`",
            "512, 512",
            "tokens; prompts longer than this follow `truncation`. The response length is the "
            "rollout's generation cap."),
        Row("`truncation`",
            "`error`",
            "`error` \\| `left` \\| `right` \\| `middle` for over-long prompts. With `error` and "
            "`filter_overlong_prompts=false`, every prompt is tokenized when the dataset is built and"
            " the first over-long one stops the run there, naming its file and row (not when a step "
            "draws it)."),
        Row("`max_row_bytes`",
            "16777216",
            "hybridflow-only. A data row holding more text and binary data than this (16 MiB) is "
            "refused when the file is read, before anything tokenizes it, naming the file and row; "
            "rows nested more than 64 levels deep are refused too. Raise it for rows with many large "
            "images."),
        Row("`filter_overlong_prompts`",
            "false",
            "drop over-long prompts at load time instead."),
        Row("`train_batch_size`",
            "1024",
            "**prompts** per step (global). See [batch-sizes.md](batch-sizes.md)."),
        Row("`gen_batch_size`",
            "null",
            "prompts per generation round with DAPO dynamic sampling; null (verl 0.9's default) = "
            "`train_batch_size`."),
        Row("`val_batch_size`",
            "null",
            "null = whole validation set in one round."),
        Row("`shuffle`, `seed`",
            "true, 1",
            "training sampler order (resumable)."),
        Row("`validation_shuffle`",
            "false",
            ""),
        Row("`apply_chat_template_kwargs`",
            "`{}`",
            "passed to `tokenizer.apply_chat_template` (e.g. "
            "`+data.apply_chat_template_kwargs.enable_thinking=false`)."),
        Row("`custom_cls`, `sampler`",
            "nulls",
            "a custom dataset class (`custom_cls.{path,name}`) / sampler class "
            "(`sampler.{class_path,class_name}`), loaded with "
            "[`load_object`](#extensions-trainerimport_modules-and-load_object) from a `.py` file or "
            "a module."),
        Row("`dataloader_num_workers`",
            "0",
            "loader worker processes."),
        Row("`return_full_prompt`",
            "false",
            "add the templated prompt text to every row (`full_prompts`, e.g. for reward functions)."),
        Row("`return_raw_chat`",
            "true",
            "the chat messages (`raw_prompt`) are always kept (the rollout renders from them); "
            "`false` is refused."),
    )),
    Section('model', 'actor_rollout_ref.model', (
        Row("`path`",
            "`~/models/deepseek-llm-7b-chat`",
            "a local Hugging Face folder (no hub downloads here; build tiny ones with "
            "`hybridflow.utils.tiny_model`)."),
        Row("`tokenizer_path`, `custom_chat_template`",
            "null",
            ""),
        Row("`trust_remote_code`, `external_lib`, `override_config`",
            "",
            "`override_config` entries are applied to the HF config before loading."),
        Row("`enable_gradient_checkpointing`",
            "null",
            "activation checkpointing (recompute each decoder layer in backward) for the actor; `critic.model.` "
            "and PRIME's `reward_model.model.` have their own. true / false as set; null (verl's default is true) "
            "decides by memory: on only when a training micro-batch's activations (estimated from the model's "
            "shape, the micro-batch keys and the longest sequence) exceed half of what the process has free "
            "after its parameters, gradients and AdamW states. Rank 0 prints the decision and its numbers."),
        Row("`use_remove_padding`",
            "true",
            "pack sequences without padding in the forward pass (`actor.use_remove_padding` follows "
            "it and can override it for the actor; `reward_model.model.use_remove_padding` for the "
            "reward model)."),
        Row('`use_fused_kernels`, `fused_kernel_options.impl_backend`, `fused_kernel_options.chunk_size`',
            'false',
            "`actor.use_fused_kernels` follows it. The actor's and the reference's LM head fused with "
            "its log-softmax (`engine/fused_head.py`):"
            " log-probs, entropy and `sum_pi_squared` from the hidden states and the head's weight,"
            ' `chunk_size` tokens at a time (0: as many as keep 128 MB of fp32 logits), forward and'
            " backward (the backward recomputes each chunk's logits), so the (tokens x vocabulary) logits"
            ' never exist; with tensor parallelism the vocabulary-split head reduces per rank. Equal to the'
            ' materialised head within 1e-5 (tested); at a 151,936-token vocabulary it takes 0.37x the'
            ' extra memory of materialised logits for 2,048 tokens (`benchmarks/RESULTS.md` section 22;'
            " 0.11x in bf16 on an H200, section 23). `impl_backend=triton` (verl's FSDP lines) loads with a"
            ' note: the chunked torch head runs whichever backend is named; `use_torch_compile` acts on the'
            ' materialised head only'),
        Row("`lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`",
            "0, 16, all-linear, null",
            "LoRA when `lora_rank > 0`; `hybridflow merge` folds it back."),
        Row("`lora_adapter_path`",
            "null",
            "start from a saved PEFT LoRA adapter (e.g. `<ckpt>/actor/huggingface/lora_adapter`): its"
            " own `adapter_config.json` sets rank, alpha and targets (as verl, `lora_rank` may stay "
            "0); the reference is the model with the adapter disabled; a resumed checkpoint restores "
            "its trained adapter over it."),
        Row("`hf_config_path`",
            "null",
            "take the model config (`config.json`) from this folder instead of `path`."),
        Row("`enable_activation_offload`",
            "false",
            "on GPU, tensors saved for backward go to pinned host memory during the update's forward "
            "(`torch.autograd.graph.save_on_cpu`); on CPU they are in host memory already. Same for "
            "`critic.model`."),
    )),
    Section('actor', 'actor_rollout_ref.actor', (
        Row("`strategy`",
            "fsdp",
            "`fsdp` and `fsdp2` both mean FSDP2; `megatron` is FSDP2 laid out by the role's "
            "`megatron` node (tensor / expert / context parallelism, "
            "[parallelism.md](parallelism.md))."),
        Row("`ppo_mini_batch_size`",
            "256",
            "**prompts** per optimizer step (global)."),
        Row("`ppo_micro_batch_size_per_gpu`",
            "null",
            "trajectories per forward/backward per device. Required unless `use_dynamic_bsz`."),
        Row("`ppo_micro_batch_size`",
            "null",
            "deprecated global form, divided by the device count (note)."),
        Row("`use_dynamic_bsz`, `ppo_max_token_len_per_gpu`",
            "false, 16384",
            "token-budget micro-batches."),
        Row("`ppo_epochs`, `shuffle`, `data_loader_seed`",
            "1, false, 42",
            "passes over each step's data."),
        Row("`clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`",
            "0.2, 0.2, 0.2, 3.0",
            "PPO clip range (asymmetric for DAPO) and dual-clip bound."),
        Row("`tau_pos`, `tau_neg`",
            "1.0, 1.05",
            "SAPO temperatures."),
        Row("`policy_loss.loss_mode`",
            "vanilla",
            "see [algorithms.md](algorithms.md); `clip_cov_*`, `kl_cov_ratio`, `ppo_kl_coef` "
            "parameterise the cov losses."),
        Row("`loss_agg_mode`",
            "token-mean",
            "see [algorithms.md](algorithms.md)."),
        Row("`loss_scale_factor`",
            "null",
            "constant divisor for `seq-mean-token-sum-norm`."),
        Row("`entropy_coeff`, `calculate_entropy`",
            "0.0, false",
            "entropy bonus / logging."),
        Row("`use_torch_compile` (actor; `ref.use_torch_compile` follows it)",
            "true",
            "run the log-prob / entropy kernels through `torch.compile` when the vocabulary has >= "
            "2048 entries (2.4-2.7x faster fwd+bwd at V=2048-32000 on CPU; compiling costs ~20 s once"
            " per process, which tiny vocabularies never repay, so they stay eager). Measured by "
            "`benchmarks/bench_compile.py`; see `hybridflow/engine/compiled_kernels.py`."),
        Row("`use_kl_loss`, `kl_loss_coef`, `kl_loss_type`",
            "false, 0.001, low_var_kl",
            "KL to the reference as a loss term (GRPO style)."),
        Row("`grad_clip`",
            "1.0",
            "max gradient norm."),
        Row("`max_consecutive_skipped_steps`",
            "5",
            "hybridflow-only: a step with a non-finite loss/gradient is skipped; after this many in a"
            " row the run aborts."),
        Row("`checkpoint.save_contents`, `load_contents`",
            "model, optimizer, extra",
            "what a checkpoint holds."),
        Row('`checkpoint.strict`',
            'true',
            'false: a resume loads the model tensors the checkpoint and the model share (the others keep'
            " their values, the checkpoint's extra tensors are left out; both named in a warning; shapes"
            ' must agree) and the optimizer starts afresh; true: any difference is an error naming the'
            ' folder and the tensors.'),
        Row("`optim.optimizer_impl`, `optimizer`",
            "torch.optim, AdamW",
            "the optimizer class, as verl: a module and a class in it (`torch.optim` + `SGD`, "
            "`bitsandbytes.optim` + `AdamW8bit` if installed...)."),
        Row("`optim.lr`, `weight_decay`, `betas`",
            "1e-6, 0.01, [0.9,0.999]",
            "`betas` only for classes that take them; `override_optimizer_config` entries are passed "
            "last. `optim.clip_grad` is verl's other spelling of `actor.grad_clip` (used when "
            "`grad_clip` is left at its default)."),
        Row("`optim.lr_warmup_steps`, `lr_warmup_steps_ratio`, `lr_scheduler_type`, `min_lr_ratio`, "
            "`num_cycles`",
            "-1, 0.0, constant, 0.0, 0.5",
            "warm-up then `constant` or `cosine`. `warmup_style` is a deprecated alias (note)."),
        Row("`optim.total_training_steps`",
            "-1",
            "filled in by the trainer."),
        Row("`fsdp_config.param_offload`, `optimizer_offload`, `offload_policy`, "
            "`reshard_after_forward`, `fsdp_size`",
            "",
            "FSDP2 settings (`hybridflow/engine/fsdp.py`). On a one-rank group the model is not "
            "wrapped."),
        Row("`fsdp_config.model_dtype`, `dtype`",
            "fp32, bfloat16",
            "parameter dtype and GPU compute dtype. On CPU the default compute is fp32 (`dtype` is a "
            "GPU setting)."),
        Row("`fsdp_config.mixed_precision.param_dtype`, `reduce_dtype`, `buffer_dtype`",
            "null, null, null",
            "verl's spelling "
            "(`+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16`): the compute "
            "dtype of the unsharded parameters (FSDP2 `MixedPrecisionPolicy`, or autocast on a "
            "one-process group), the gradient-reduction dtype (null = fp32) and the dtype of the "
            "module's floating buffers (null = as loaded). An explicit `param_dtype` wins over "
            "`dtype` and is honoured **on CPU too** (bf16 over gloo works; it is slower than fp32 "
            "there and mainly useful to reproduce GPU numerics). Master weights stay in "
            "`model_dtype`."),
        Row("`fsdp_config.seed`",
            "42",
            "seeds the worker's torch RNG before the models load (LoRA / critic head init)."),
        Row("`fsdp_config.full_determinism`",
            "false",
            "deterministic kernels and every RNG seeded from `seed` "
            "(`transformers.enable_full_determinism`); slower."),
        Row("`fsdp_config.wrap_policy.transformer_layer_cls_to_wrap`, `forward_prefetch`",
            "null, false",
            "the module classes FSDP2 shards as units (default: the model's decoder layers; an "
            "unknown name is an error listing the model's classes); `forward_prefetch` all-gathers "
            "the next unit during the current one's forward (depth 1, as verl's FSDP2)."),
        Row("`use_prefix_grouper`",
            "false",
            "a prompt's samples share one forward of the prompt in the actor's passes (the same "
            "numbers; [performance.md](performance.md#forward-passes)). Needs sdpa/eager attention; "
            "not with Ulysses sp > 1 or vision-language rows."),
        Row("`entropy_checkpointing` (also `fsdp_config.entropy_checkpointing`)",
            "false",
            "recompute the entropy's softmax in backward instead of keeping it (when the entropy is "
            "in the loss)."),
        Row("`ulysses_sequence_parallel_size`",
            "1",
            "Ulysses sequence parallelism: the devices form dp = devices / sp groups; the sp devices "
            "of a group share each micro-batch, each holding 1/sp of its packed tokens, and swap "
            "token shards for head shards around attention. Must divide the devices and the model's "
            "attention heads (key/value heads: divide sp or be divisible by it); needs "
            "`use_remove_padding=true`. Mini-batches divide by dp, token budgets cover "
            "`*_max_token_len_per_gpu x sp` tokens per micro-batch. `ref.`, `critic.` and "
            "`reward_model.ulysses_sequence_parallel_size` do the same for those roles (the ref "
            "follows the actor unless set). See [sequence_parallel.md](sequence_parallel.md)."),
    )),
    *ROLLOUT_SECTIONS,  # actor_rollout_ref.rollout and reward_model: config_reference_rollout_rows.py
    Section('algorithm', 'algorithm', (
        Row("`adv_estimator`",
            "gae",
            "any registered estimator ([algorithms.md](algorithms.md))."),
        Row("`gamma`, `lam`",
            "1.0, 1.0",
            "GAE discount and lambda (also gamma for REINFORCE++)."),
        Row("`norm_adv_by_std_in_grpo`",
            "true",
            "false gives Dr. GRPO."),
        Row("`use_kl_in_reward`, `kl_penalty`",
            "false, kl",
            "KL to the reference subtracted from the token rewards, with this estimator."),
        Row("`kl_ctrl.type`, `kl_coef`, `target_kl`, `horizon`",
            "fixed, 0.001, 0.1, 10000",
            "coefficient controller for the in-reward KL."),
        Row("`use_pf_ppo`, `pf_ppo.reweight_method`, `weight_pow`",
            "false, pow, 2.0",
            "PF-PPO resampling of the batch by reward."),
        Row("`filter_groups.enable`, `metric`, `max_num_gen_batches`",
            "false, null, 0",
            "DAPO dynamic sampling: keep only groups whose `metric` varies; generate more rounds "
            "until `train_batch_size` groups are kept."),
        Row("`rollout_correction.bypass_mode`, `loss_type`",
            "false, ppo_clip",
            "verl's bypass mode (needs `rollout.calculate_log_probs=true`): the rollout's log-probs "
            "are pi_old (no old-log-prob pass, any number of mini-batches) and the correction moves "
            "into the actor's loss, comparing the policy being trained with the rollout's: "
            "`loss_type=ppo_clip` is PPO clip on pi_theta/mu (IS weights reported, not applied: the "
            "ratio is the weight); `reinforce` is `-sg(w) log pi A` with `w` the truncated IS weight "
            "of `rollout_is`. `rollout_rs` rejects tokens in both. `loss_type` without `bypass_mode`,"
            " a non-vanilla `policy_loss.loss_mode` or `optimal_token_baseline` with it are refused."),
        Row('`rollout_correction.rollout_is`, `rollout_is_threshold`, `rollout_rs`, '
            '`rollout_rs_threshold`, `rollout_is_batch_normalize`',
            'null, 2.0, null, null, false',
            "truncated IS weights (`token`/`sequence`; a `'lower_upper'` threshold zeroes weights outside"
            ' the bounds, IcePop) and rejection (comma-separated criteria `token_k1`...`seq_max_k3` with'
            " one threshold each, or the older `token`/`sequence`/`geometric`) between the actor's pi_old"
            " and the rollout's mu, applied after the advantages"
            ' ([algorithms.md](algorithms.md#other-batch-level-options)); needs'
            ' `rollout.calculate_log_probs=true` (an error names it otherwise). Metrics `rollout_corr/*`.'),
    )),
    Section('trainer', 'trainer', (
        Row("`backend`",
            "ray",
            "hybridflow-only. `ray`: worker groups are Ray actors. `local`: everything in this "
            "process, one device (use it with pdb, see [debugging.md](debugging.md))."),
        Row("`device`",
            "auto",
            "hybridflow-only. `auto` picks CUDA when available, else CPU; `cpu`, `cuda` force it. "
            "NCCL on GPU, gloo on CPU."),
        Row("`nnodes`, `n_gpus_per_node`",
            "1, 8",
            "devices of the training pool; with `device=cpu` each \"gpu\" is one worker process. "
            "`backend=local` always counts 1."),
        Row("`total_epochs`, `total_training_steps`",
            "30, null",
            "stop at whichever comes first."),
        Row("`balance_batch`",
            "true",
            "reorder a step's trajectories so each rank gets a similar token count."),
        Row("`critic_warmup`",
            "0",
            "steps that train only the critic."),
        Row("`test_freq`, `val_before_train`, `val_only`",
            "-1, true, false",
            "validation schedule."),
        Row("`async_validation`",
            "false",
            "hybridflow-only: validation off the critical path. When due it runs on a thread of its own, on "
            "the rollout replicas between training requests, against the weights of the step it was due at, "
            "and its metrics are logged at that step (`timing_s/testing_background`); training goes on, and "
            "only the next weight push waits for it (`timing_s/testing_wait`). Acts in `fully_async` and V1 "
            "`separate_async` (their replicas keep a version's weights); refused at config time in the other "
            "modes. See [reliability.md](reliability.md#validation-off-the-critical-path)."),
        Row("`log_val_generations`",
            "0",
            "sample generations logged per validation."),
        Row("`rollout_data_dir`, `validation_data_dir`",
            "null",
            "JSONL dumps of generations (verl format)."),
        Row("`save_freq`, `default_local_dir`",
            "-1, `checkpoints/<project>/<experiment>`",
            "checkpoints `global_step_N/`."),
        Row("`rollout_wal.enable`, `rollout_wal.max_mb`",
            "true, 1024",
            "hybridflow-only: the rollout log of the async and V1 modes (`one_step_off`, `fully_async`, V1 "
            "`colocate_async` / `separate_async`): every generated sample is written (fsync'd) to "
            "`default_local_dir/rollout_wal/<mode>.log` before the trainer can take it, kept until a "
            "checkpoint covers it, so a crash (`kill -9` included) loses nothing generated and trains nothing "
            "twice. Acts when checkpoints are saved (`save_freq > 0`). A sample that would grow the log past "
            "`max_mb` is not logged (`rollout_wal/unlogged_samples`, a warning) and is generated again after "
            "a crash. Metrics `rollout_wal/{bytes,restored_samples,replayed_steps}`. See "
            "[reliability.md](reliability.md#durable-rollouts)."),
        Row("`resume_mode`, `resume_from_path`",
            "auto, null",
            "`auto` resumes from the checkpoint `latest_checkpointed_iteration.txt` names when it is "
            "complete, else (file missing, or naming a broken folder) from the newest complete one by"
            " its manifest, and says so; `disable`; or `resume_path` (must be complete). See "
            "[reliability.md](reliability.md#no-data-loss-on-resume). A run that would do nothing is an "
            "error (exit 2, one line): resumed to step 0 while checkpoints exist, a resumed run that trains "
            "no step while steps remain, or training data that runs out before `total_training_steps` "
            "([drift.md](drift.md#a-run-that-does-nothing))."),
        Row("`overwrite_checkpoints`",
            "false",
            "hybridflow-only. A run that saves (`save_freq > 0`) refuses to start when "
            "`default_local_dir` holds `global_step_N` folders later than the one it resumes from "
            "(all of them on a fresh start): it would replace them. `true` allows it."),
        Row("`max_actor_ckpt_to_keep`, `max_critic_ckpt_to_keep`",
            "null",
            "checkpoint rotation."),
        Row("`logger`",
            "[console]",
            "any of `console`, `file` (`metrics.jsonl`), `tensorboard`, `wandb` (alias `tracking`), "
            "`mlflow`, `swanlab`, `prometheus` (the run's metrics on an HTTP `/metrics` endpoint of the "
            "driver, for a cluster's Prometheus to scrape while the run lives). Output folder: "
            "`outputs/<project_name>/<experiment_name>`; `hybridflow report --serve` shows its report live."),
        Row("`project_name`, `experiment_name`",
            "verl_examples, gsm8k",
            ""),
        Row("`seed`",
            "1",
            ""),
        Row("`report`",
            "true",
            "hybridflow-only: write `report.html` at the end (needs a logger with an output folder, "
            "e.g. `file`)."),
        Row("`prometheus.host`, `prometheus.port`",
            "127.0.0.1, 9464",
            "hybridflow-only, with `trainer.logger=[...,prometheus]` (refused without it): where `/metrics` is "
            "served. Loopback by default; `0.0.0.0` or the node's address lets a Prometheus on another host "
            "scrape it; port 0 takes a free one, printed at start. Series: "
            "[debugging.md](debugging.md#live-metrics-prometheus-and-the-live-report)."),
        Row("`prometheus.drift_threshold`",
            "0.1",
            "a step whose rollout and actor token probabilities differ by more "
            "(`training/rollout_probs_diff_max`) counts in `hybridflow_drift_steps_total`."),
        Row("`tolerated_failure_fraction`",
            "0.5",
            "hybridflow-only: the share of a step's trajectories (agent loop raised), rewards (the "
            "scorer raised, timed out, returned no finite number, or could not score the row: unknown"
            " `data_source`, no ground truth) or tool calls (the tool raised, timed out or returned "
            "garbage) that may fail while the run goes on; the failed items are counted "
            "(`rollout/failed_fraction`, `reward/error_fraction`, `rollout/tool_crash_fraction`) and "
            "left out of training. Above it the run stops with exit 1, the counts and the first "
            "error; a step where *all* of them failed, or where no model token is left to train on "
            "(sum of `response_mask` 0), always stops. Between 0 (stop at the first failure) and 1 "
            "(stop only when everything failed). See [reliability.md](reliability.md#silent-runs)."),
        Row("`drift.enable`, `drift.action`",
            "true, stop",
            "hybridflow-only: the drift detector ([drift.md](drift.md)). Every step the rollout's "
            "log-probs of its own tokens are compared with the trainer's recomputation (`drift/gap`: mean "
            "\\|p_rollout - p_trainer\\| over the rows generated by the weights being trained; with no "
            "old_log_prob pass, a few rows are recomputed before the update) and the rollout's prompt ids "
            "with the trainer's rendering. Above `drift.warn` the step is flagged (`drift/tripped`) and the "
            "likely cause named (`drift/cause/*`: weights, sampling, lora, template); above `drift.stop` the "
            "run ends with the diagnosis (exit 1) -- `action=warn` only flags. On, it makes the engines "
            "return each sampled token's log-prob (a gather; they are pi_old only as the step plan says)."),
        Row("`drift.warn`, `drift.stop`",
            "null, null",
            "probability gaps in [0, 1); null: the levels measured for the run's engine x dtype "
            "([drift.md](drift.md#levels)). `stop` below `warn` is refused."),
        Row("`drift.check_weights`",
            "true",
            "standalone rollout replicas are checked by weight digest after every sync and at every "
            "wake-up before generating: a replica not holding the trainer's weights stops the run naming "
            "it (exit 3). Engines with their own copy beside the actor are checked the same way always "
            "([drift.md](drift.md#weight-versions))."),
        Row("`import_modules`",
            "[]",
            "hybridflow-only: user modules imported in every process first "
            "([extensions](#extensions-trainerimport_modules-and-load_object))."),
        Row("`use_v1`, `v1.*`",
            "false, verl's",
            "verl 0.9's V1 trainer is not built yet: `use_v1=false` (what verl's scripts write) is "
            "today's trainer; `true` or any `v1.*` change is refused naming the fix "
            "(`async_training.mode` for asynchronous training). verl 0.9 defaults `use_v1` to true."),
        Row("`ray_wait_register_center_timeout`",
            "300",
            "seconds the Ray worker slots (placement groups) may take to come up before start-up "
            "fails with the missing resources."),
    )),
)
