"""What every accepted verl key does here, for the keys that need saying: refused values and inert keys.

Every key of ``ppo_trainer.yaml`` either acts, or is listed here:

* ``REFUSED``: a key whose non-default value asks for something hybridflow does not do.  Setting it is a
  configuration error (exit 2) naming the key and why, instead of a run that silently does something else.
* ``INERT``: a key that cannot mean anything here (storage systems, profilers, kernel libraries, options of
  FSDP1 or of machinery hybridflow does not have).  They are accepted so verl command lines run unchanged; the
  ones a command line sets are printed together in one note at start, and all of them form the table in
  ``docs/migrating-from-verl.md`` (``tests/config/test_key_policy.py`` keeps the two equal).

The accepted (REFUSED) or quiet (INERT) value of a key is its default in ``ppo_trainer.yaml``.  Keys are written
with ``{a,b}`` alternatives, expanded by :func:`expand`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["ACTS", "KeyRule", "REFUSED", "INERT", "expand", "policy_of", "default_of", "refusal_errors", "inert_note",
           "inert_keys_markdown", "refused_keys_markdown"]

_FSDP = "{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config"
_ROLES = "{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}"
_FROZEN = "{actor_rollout_ref.ref,reward_model.model}.fsdp_config"


@dataclass(frozen=True)
class KeyRule:
    key: str
    reason: str


_NOT_BUILT = "is not built yet in hybridflow"
REFUSED: tuple[KeyRule, ...] = (
    KeyRule("{actor_rollout_ref.actor,critic}.checkpoint.async_save",
            "asynchronous checkpoint saving is a Megatron-only feature in verl; hybridflow writes checkpoints "
            "synchronously and atomically"),
    KeyRule("actor_rollout_ref.rollout.skip_rollout",
            "verl's rollout dump-and-replay debugging aid (skip_rollout, skip_dump_dir) is not implemented; "
            "trainer.rollout_data_dir writes every step's generations"),
    KeyRule("skip",
            "verl 0.9's rollout dump-and-replay debugging aid (skip.rollout / rollout_tq / async_rollout) is not "
            "implemented; drop the key (trainer.rollout_data_dir writes every step's generations)"),
    KeyRule("actor_rollout_ref.rollout.trace.backend",
            "rollout tracing to Weave or MLflow is not implemented; trainer.rollout_data_dir and "
            "trainer.validation_data_dir write every trajectory, and the run report shows samples"),
    KeyRule("data.return_raw_chat",
            "the rollout renders prompts from the chat messages, so hybridflow always keeps them (verl's async "
            "rollout needs return_raw_chat=true as well)"),
    KeyRule("transfer_queue",
            "verl 0.9's TransferQueue data plane (the V1 trainer's) is not used: hybridflow's controller moves "
            "batches as DataProto through its worker groups. Drop the key"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.{lr_warmup_init,lr_decay_steps,weight_decay_incr_style}",
            "Megatron's schedule options: warmup here starts from 0, the decay spans the steps after warmup and the "
            "weight decay is constant; drop the key (lr_decay_style and min_lr act)"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.{use_precision_aware_optimizer,main_grads_dtype,exp_avg_dtype,exp_avg_sq_dtype,"
            "use_layer_wise_distributed_optimizer}",
            "Megatron's optimizer precision / layout options: gradients and Adam moments are kept in the parameters' "
            "dtype, sharded by FSDP2; drop the key"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.dynamic_context_parallel",
            "dynamic context-parallel scheduling is not built: context_parallel_size runs as a fixed Ulysses group"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.override_mcore_model_config",
            "overrides of Megatron-core's model config: the model is the Hugging Face one; change it with "
            "actor_rollout_ref.model.override_config"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.megatron,actor_rollout_ref.actor.megatron,"
            "actor_rollout_ref.ref.megatron}.router_replay",
            "MoE router replay (recording the rollout's expert choices for the update) is not implemented; drop the "
            "key"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.actor.fsdp_config,actor_rollout_ref.ref.fsdp_config,"
            "critic.model.fsdp_config,actor_rollout_ref.actor.megatron,actor_rollout_ref.ref.megatron,critic.megatron}"
            ".qat",
            "quantization-aware training (fake-quantized weights in the forward) is not implemented; drop the key"),
    KeyRule("{actor_rollout_ref.model,critic.model}.tiled_mlp",
            "tiled MLP (computing the MLP in sequence chunks to save activation memory) is not implemented: lower "
            "*.ppo_max_token_len_per_gpu (use_dynamic_bsz=true) or enable_gradient_checkpointing instead"),
    KeyRule("{actor_rollout_ref.model,critic.model}.mtp",
            "multi-token prediction (MTP layers, speculative decoding in the rollout) is not implemented; drop the "
            "key"),
    KeyRule("critic.model.lora_adapter_path",
            "loading a LoRA adapter into the critic is not supported (the critic's LoRA starts from "
            "critic.model.lora_rank); drop the key"),
    KeyRule("critic.model.exclude_modules",
            "the critic's LoRA wraps critic.model.target_modules; excluding modules is supported for the actor "
            "(actor_rollout_ref.model.exclude_modules) only"),
    KeyRule("actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}",
            "verl 0.9 sizes its separate rollout pool here; hybridflow sizes it with rollout.nnodes and "
            "rollout.n_gpus_per_node (the top-level rollout node) with actor_rollout_ref.hybrid_engine=false: set "
            "those instead"),
    KeyRule("actor_rollout_ref.rollout.full_determinism",
            "batch-invariant deterministic generation (vLLM's batch-invariant mode) is not implemented; drop the key "
            "(trainer.seed and rollout.seed make hf-engine runs on CPU repeatable)"),
    KeyRule("actor_rollout_ref.rollout.logprobs_mode",
            "the rollout reports log-probs of the sampling distribution (after temperature, top-k, top-p: verl's "
            "processed_logprobs); other modes are not implemented. Drop the key"),
    KeyRule("actor_rollout_ref.rollout.scheduling_policy",
            "the request scheduling policy is the engine's own (first come, first served); for vLLM pass it as "
            "actor_rollout_ref.rollout.engine_kwargs.vllm.scheduling_policy"),
    KeyRule("actor_rollout_ref.rollout.quantization_config_file",
            "a quantization config file for the rollout engine is not supported; set "
            "actor_rollout_ref.rollout.quantization (vLLM's method name) instead"),
    KeyRule("actor_rollout_ref.rollout.prometheus",
            "exporting the rollout servers' own metrics to Prometheus is not implemented; the run's metrics are "
            "served for Prometheus by trainer.logger=[...,prometheus] (trainer.prometheus.host/port)"),
    KeyRule("actor_rollout_ref.rollout.disaggregation",
            "prefill/decode disaggregation of the rollout engine is not implemented; drop the key"),
    KeyRule("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
            "checkpoint-engine backends of your own are not supported; "
            "actor_rollout_ref.rollout.checkpoint_engine.backend is naive, gloo or nccl"),
    KeyRule("actor_rollout_ref.rollout.multi_turn.function_tool_path",
            "function tools are listed in the tool YAML here: put `- class_name: your_module.your_function` (a "
            "function decorated with @function_tool) in actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    KeyRule("data.audio_key", "audio inputs are not supported (text, images and videos are)"),
    KeyRule("data.mm_processor_kwargs",
            "extra keyword arguments for the multimodal processor are not supported: the processor runs with the "
            "settings saved in the model folder (edit its preprocessor_config.json)"),
    KeyRule("algorithm.filter_groups.max_inflight_gen_batches",
            "DAPO dynamic sampling generates its rounds one at a time here; drop the key"),
)

INERT: tuple[KeyRule, ...] = (
    KeyRule("actor_rollout_ref.model.fused_kernel_options.impl_backend",
            "a kernel choice: the fused LM head (actor_rollout_ref.model.use_fused_kernels=true) is hybridflow's "
            "chunked torch function (engine/fused_head.py) whichever backend is named -- the same log-probs and "
            "entropy, computed without the whole logits tensor; no Triton kernel is shipped"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.grad_offload",
            "gradients are freed after every optimizer step (zero_grad(set_to_none)), so between phases there is no "
            "gradient buffer to offload; param_offload and optimizer_offload act"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{use_mbridge,vanilla_mbridge}",
            "the bridge between Hugging Face and Megatron-core weights; the engine loads and saves Hugging Face "
            "models directly"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{override_transformer_config,override_ddp_config}",
            "Megatron-LM's TransformerConfig and DDP options (kernel fusions, recompute, attention backend, gradient "
            "buckets); recompute here is actor_rollout_ref.model.enable_gradient_checkpointing and gradients reduce "
            "through FSDP2. Two of its keys act: num_layers_in_{first,last}_pipeline_stage place layers on the "
            "end pipeline stages"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{dist_checkpointing_prefix,dist_ckpt_optim_fully_reshardable,"
            "distrib_optim_fully_reshardable_mem_efficient}",
            "options of Megatron's distributed-checkpoint writer and optimizer resharding; the start checkpoint is read "
            "whole (use_dist_checkpointing) and the run's own checkpoints always resume on another layout "
            "(engine/engine_checkpoint.py)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{max_seqlen_per_dp_cp_rank,use_remove_padding,pad_bshd_to_minibatch_max,pad_to_length,"
            "pad_to_length_bucket,entropy_from_logits_with_chunking,entropy_from_logits_chunk_size,forward_only}",
            "the Megatron engine's copies of role settings: <role>.use_remove_padding (model.use_remove_padding), "
            "the role's micro-batch padding and entropy chunking are the keys read, and whether a model trains "
            "follows from its role"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{seed,dtype}",
            "Megatron's RNG-tracker seed and parameter dtype: the engine's seed is <role>.fsdp_config.seed and its "
            "compute dtype <role>.fsdp_config.mixed_precision.param_dtype"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.{lr_wsd_decay_style,lr_wsd_decay_steps}",
            "options of Megatron's warmup-stable-decay schedule, which is not offered (lr_decay_style=WSD is refused)"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.use_checkpoint_opt_param_scheduler",
            "the schedule's state is always saved with a checkpoint and restored on resume"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.use_megatron_fsdp",
            "Megatron-FSDP (ZeRO-3) is what FSDP2 does here on every layout"),
    KeyRule("actor_rollout_ref.rollout.trace.{token2text,max_samples_per_step_per_worker,project_name,"
            "experiment_name}",
            "options of verl's rollout tracing, which is refused (rollout.trace.backend)"),
    KeyRule("{data,actor_rollout_ref.model,critic.model,reward_model.model}.use_shm",
            "copies files fetched from HDFS into /dev/shm; hybridflow reads local folders and hub names in place"),
    KeyRule("trainer.default_hdfs_dir", "HDFS upload of checkpoints (no HDFS client here)"),
    KeyRule("trainer.del_local_ckpt_after_load",
            "deletes the local copy verl downloaded from HDFS; hybridflow resumes from the checkpoint folder in place "
            "and never deletes it"),
    KeyRule("trainer.esi_redundant_time",
            "saving before a Volcano Engine ESI (elastic instance) expires; no such platform here"),
    KeyRule("global_profiler", "verl's nsys / NPU / torch profiler hooks: profile with torch.profiler or py-spy"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,actor_rollout_ref.rollout,critic,reward_model}.profiler",
            "per-role profiler hooks (see global_profiler)"),
    KeyRule("{actor_rollout_ref.model,critic.model}.use_liger",
            "Liger GPU kernels (not shipped); they compute the same numbers as the plain modules"),
    KeyRule("{reward_model.model,critic.model}.use_fused_kernels",
            "a critic's / reward model's score head is no vocabulary projection: nothing to fuse (the actor's and "
            "the reference's LM head runs fused with actor_rollout_ref.model.use_fused_kernels=true)"),
    KeyRule("critic.model.fused_kernel_options", "options of the critic's fused kernels (see use_fused_kernels)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref}.entropy_from_logits_with_chunking",
            "the entropy is always computed 2048 rows at a time here: the same numbers with bounded memory"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref}.entropy_from_logits_chunk_size",
            "the entropy is always computed 2048 rows at a time here: the same numbers with bounded memory"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.{entropy_from_logits_with_chunking,"
            "entropy_from_logits_chunk_size}",
            "verl 0.9's engine copy of <role>.entropy_from_logits_*; the entropy is computed 2048 rows at a time here"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref}.pad_to_length",
            "padding every micro-batch to a fixed length (verl's NPU / compile aid); micro-batches here are padded to "
            "their longest row"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.{pad_to_length,"
            "pad_to_length_bucket}",
            "verl 0.9's fixed-length padding of micro-batches (see <role>.pad_to_length)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.{use_torch_compile,strategy,"
            "forward_only}",
            "verl 0.9's engine copies of role settings: <role>.use_torch_compile and <role>.strategy are the keys read, "
            "and whether a model trains follows from its role"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.turbo_config.distributed."
            "{fsdp_plan,ep_plan,cp_plan,expert_fully_shard_parallel_size}",
            "FSDP-Turbo's module-glob sharding, dispatch and context-parallel patch plans: FSDP2 here wraps every decoder "
            "layer and the root, the experts shard over their own mesh and Ulysses wraps the attention (the sizes of "
            "turbo_config.distributed act with strategy=fsdp_turbo)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.turbo_config.{memory.recompute_plan,"
            "module_patches}",
            "FSDP-Turbo's per-module recompute list and forward patches: memory.recompute=true checkpoints every decoder "
            "layer (actor_rollout_ref.model.enable_gradient_checkpointing); transformers' modules run unpatched"),
    KeyRule(f"{_ROLES}.veomni.{{attn_implementation,moe_implementation,cross_entropy_loss_implementation,"
            "rms_norm_implementation,swiglu_mlp_implementation,rotary_pos_emb_implementation,"
            "rms_norm_gated_implementation,causal_conv1d_implementation,chunk_gated_delta_rule_implementation,"
            "load_balancing_loss_implementation,dsa_indexer_implementation,dsa_attention_implementation,"
            "mhc_implementation,force_use_huggingface}",
            "VeOmni's kernel backends (flash / fused / triton / tilelang / liger): the engine here runs transformers' "
            "modules with sdpa or flash attention by device, which compute the same numbers"),
    KeyRule(f"{_ROLES}.veomni.{{init_device,full_determinism,enable_reentrant,activation_gpu_limit,basic_modules,"
            "pad_to_length,pad_to_length_bucket,use_torch_compile,entropy_from_logits_with_chunking,"
            "entropy_checkpointing,forward_only,strategy,ckpt_manager}",
            "VeOmni's engine internals and copies of role settings: models load on the CPU then shard, gradient "
            "checkpointing is non-reentrant, micro-batches pad to their longest row, the role's use_torch_compile / "
            "entropy keys are the ones read, and checkpoints are this engine's own (resume on any layout)"),
    KeyRule(f"{_ROLES}.engine.attention_backend_override",
            "Megatron Lite's attention kernel choice: the engine here picks sdpa or flash attention by device (the same "
            "numbers)"),
    KeyRule(f"{_FSDP}.wrap_policy.min_num_params",
            "FSDP1's size-based auto-wrap; FSDP2 shards per decoder layer (verl's FSDP2 path ignores it too)"),
    KeyRule(f"{_FSDP}.use_orig_params", "an FSDP1 flag; FSDP2 always keeps the original parameters (as DTensors)"),
    KeyRule(f"{_FSDP}.grad_offload", "deprecated in verl and ignored there"),
    KeyRule(f"{_FROZEN}.optimizer_offload", "the reference / reward model has no optimizer"),
    KeyRule(f"{_FROZEN}.mixed_precision.reduce_dtype", "the reference / reward model has no gradients to reduce"),
    KeyRule(f"{_FROZEN}.seed", "a frozen model loaded from a checkpoint draws no random numbers"),
    KeyRule("{actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config.entropy_checkpointing",
            "that model computes no entropy"),
    KeyRule("actor_rollout_ref.ref.entropy_checkpointing", "the reference computes no entropy"),
    KeyRule("data.{tokenizer,return_raw_input_ids,trust_remote_code,datagen.path,datagen.name}",
            "not read by verl's trainer either (the tokenizer comes from actor_rollout_ref.model)"),
    KeyRule("data.filter_overlong_prompts_workers",
            "process count of verl's datasets-based length filter; hybridflow's filter tokenises each prompt once in "
            "the driver and reuses the ids for the items"),
    KeyRule("data.image_patch_size",
            "the vision patch size comes from the model's processor (preprocessor_config.json)"),
    KeyRule("data.function_tool_path", "verl's copy of actor_rollout_ref.rollout.multi_turn.function_tool_path"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.total_training_steps",
            "filled by the trainer from trainer.total_training_steps or the epochs (verl overwrites it too)"),
    KeyRule("trainer.use_legacy_worker_impl", "hybridflow has one worker implementation"),
    KeyRule("actor_rollout_ref.rollout.over_sample_rate",
            "no effect in verl either: its only reader, the SGLang SPMD rollout (aborting a step's last requests once "
            "(1 - over_sample_rate) of them finished), was removed from verl; every trajectory of a step runs to its "
            "end, as in verl"),
    KeyRule("actor_rollout_ref.rollout.skip_dump_dir", "only read with rollout.skip_rollout, which is refused"),
    KeyRule("actor_rollout_ref.actor.policy_loss.dro_beta",
            "read by verl's dro policy loss only, which hybridflow does not register (loss_mode=dro is refused)"),
    KeyRule("actor_rollout_ref.rollout.moe_tensor_parallel_size",
            "TensorRT-LLM's split of the MoE layers inside the rollout's tensor-parallel group (moe_tensor_parallel_size "
            "x expert_parallel_size = tensor_model_parallel_size); TensorRT-LLM is not an engine here. vLLM splits "
            "experts by its tensor parallelism, or over tp x dp with expert_parallel_size = tp x dp (which acts)"),
    KeyRule("actor_rollout_ref.rollout.moe_load_balance_metrics_interval",
            "MoE expert-load metrics of the rollout engine are not computed"),
    KeyRule("{actor_rollout_ref.model,critic.model}.lora.merge",
            "how LoRA weights reach the rollout (merged into the base weights, or as adapters): the hf engine runs "
            "the actor's adapters in place (its own copy next to a tp/ep-split actor gets them merged) and vLLM "
            "receives the adapters, which gives the same numbers as merging"),
    KeyRule("{actor_rollout_ref.model,critic.model}.lora.a2a_experimental",
            "Megatron's all-to-all communication for LoRA on expert layers; adapters here are plain peft modules, "
            "and with expert parallelism each rank folds its own experts' adapters into them after the tokens' "
            "all-to-all"),
    KeyRule("actor_rollout_ref.rollout.engine_kwargs.trtllm",
            "engine arguments of TensorRT-LLM, which has no adapter here (rollout.name=trtllm is refused)"),
    KeyRule("actor_rollout_ref.rollout.{mtp,qat}",
            "verl 0.9's rollout copies of model.mtp and actor.fsdp_config.qat, which are refused when switched on"),
    KeyRule("critic.model.{hf_config_path,custom_chat_template}",
            "the critic reads its config from critic.model.path and renders no chat (it scores the actor's tokens)"),
)


# Keys verl 0.9 added (beside its early-2026 tree) that act here, and where; with REFUSED, INERT and the aliases of
# ``loader.PATH_ALIASES`` they account for every key of verl 0.9's _generated_ppo_trainer.yaml
# (tests/config/test_verl09.py keeps it so).
ACTS: tuple[KeyRule, ...] = (
    KeyRule("{actor_rollout_ref.actor,critic}.optim.zero_indexed_step",
            "the cosine schedule counts optimizer steps from 0, or from 1 when false (engine/optim.py)"),
    KeyRule("critic.loss_scale_factor",
            "the constant of the critic's seq-mean-token-sum-norm value loss (follows the actor's, as in verl)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref}.rollout_n",
            "verl's copies of actor_rollout_ref.rollout.n; a different value is refused (config/checks/normalise.py)"),
    KeyRule("ray_kwargs.ray_init.runtime_env.py_executable",
            "passed to ray.init's runtime_env when set (dropped when null, as verl's scripts write it)"),
    KeyRule("reward_model.{reward_loop_source,reward_loop_module_path,reward_loop_class_name}",
            "verl's reward-manager source: a registered name, or a class loaded from a file "
            "(reward.reward_manager.{source,module.path,module.name} in verl 0.9)"),
    KeyRule("model_engine",
            "dp trains with FSDP2; megatron puts the actor, reference and critic on strategy=megatron (the "
            "torch-native N-D engine); veomni lays FSDP2 out by the roles' veomni nodes; torchtitan and automodel are "
            "refused (config/checks/megatron.py, config/checks/engines.py)"),
    KeyRule(f"{_ROLES}.{{model_engine,veomni,engine}}",
            "verl's per-role engine (dp | megatron | veomni | mlite, or actor@actor_rollout_ref.actor=<engine>_actor), "
            "VeOmni's node (offload, fsdp_size, full shard, FSDP offload, prefetch, seed, precision, Ulysses and expert "
            "sizes, router_replay) and Megatron Lite's engine node (tp pp vpp ep cp etp, offload, impl_cfg.use_thd / "
            "recompute / optimizer) laid onto FSDP2 or the N-D engine (config/checks/engines.py); kernel choices are "
            "inert"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model}.fsdp_config.turbo_config.{distributed,memory}",
            "with <role>.strategy=fsdp_turbo: fully_shard_parallel_size -> fsdp_size, ulysses_parallel_size -> Ulysses, "
            "expert_parallel_size -> the N-D engine's experts, memory.recompute -> gradient checkpointing "
            "(config/checks/engines.py)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{tensor_model_parallel_size,expert_model_parallel_size,expert_tensor_parallel_size,"
            "pipeline_model_parallel_size,virtual_pipeline_model_parallel_size,pipeline_schedule,context_parallel_size,"
            "param_offload,optimizer_offload,use_distributed_optimizer}",
            "with <role>.strategy=megatron: the tp / ep / pp dimensions of the role's mesh (ep inside dp, or over "
            "dp x cp x tp blocks as Megatron when it does not divide dp; pp stages, interleaved with virtual stages), "
            "context parallelism as Ulysses, offload through the role's fsdp_config; expert tensor parallelism > 1 "
            "and a replicated optimizer are refused with the reason (config/checks/megatron.py, "
            "docs/parallelism.md)"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.{lr_decay_style,min_lr}",
            "Megatron's spelling of the schedule: lr_decay_style constant | cosine sets lr_scheduler_type, min_lr sets "
            "min_lr_ratio = min_lr / lr; other decay styles are refused (config/checks/megatron.py)"),
    KeyRule("trainer.import_modules", "user modules imported in every process of the run before names are checked"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.{use_dist_checkpointing,"
            "dist_checkpointing_path}",
            "with <role>.strategy=megatron the role starts from the torch distributed checkpoint (DCP, Megatron's "
            "torch_dist) at dist_checkpointing_path: transformers names or Megatron-core's GPT names, any layout "
            "(engine/dist_checkpoint.py); model.path still gives the architecture and tokenizer"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.sequence_parallel",
            "with tensor_model_parallel_size > 1 (default true, as verl): each decoder layer keeps its norms' "
            "activations and residual stream split along the tokens over the tp group, gathered for attention and "
            "the MLP (the same numbers, less activation memory; engine/tp_sequence.py)"),
    KeyRule("actor_rollout_ref.actor.checkpoint.strict",
            "false: a resume loads the model tensors the checkpoint and the model share (the rest keep their values, "
            "the checkpoint's extra tensors are left out, both named in a warning; shapes must agree) and the "
            "optimizer starts afresh; true: any difference is an error (engine/engine_checkpoint.py)"),
    KeyRule("{actor_rollout_ref.model,critic.model}.lora.{type,rank,alpha,dropout,target_modules,exclude_modules,"
            "dropout_position,lora_A_init_method,lora_B_init_method,dtype,adapter_path,freeze_vision_model,"
            "freeze_vision_projection,freeze_language_model}",
            "Megatron's LoRA node (rank > 0) trains peft adapters: rank / alpha / adapter_path, Megatron module names "
            "as transformers' (linear_qkv -> q/k/v_proj ...), dropout, type=dora, A / B initialisation; values with "
            "no counterpart (dropout_position=post, a dtype of their own, unfrozen base weights) are refused with the "
            "reason (engine/lora_options.py, engine/checks.py)"),
    KeyRule("actor_rollout_ref.actor.use_prefix_grouper",
            "the samples of a prompt share one forward of the prompt in the actor's log-prob and update passes "
            "(engine/prefix_grouping.py)"),
    KeyRule("trainer.use_v1", "verl 0.9's V1 trainer: trainer.v1.trainer_mode picks sync (today's step, bit for bit), "
            "colocate_async or separate_async (config/v1.py; rules in config/checks/v1.py; docs/async.md)"),
    KeyRule("trainer.v1", "the V1 trainer's node: every key acts in the mode that reads it or is refused with the "
            "reason (config/checks/v1.py)"),
    KeyRule("distillation",
            "on-policy distillation: teachers as worker groups of their own score the student's samples, the actor "
            "adds the per-token reverse KL as a reward or a loss (trainer/teachers.py; config/checks/recipes.py)"),
    KeyRule("reward_model.rollout",
            "a generative reward model (judge) served on the rollout service behind the judge router; reward "
            "functions ask it (trainer/judge_service.py, rewards/judge.py; config/checks/judge.py)"),
    KeyRule("reward_model.{enable_resource_pool,n_gpus_per_node,nnodes}",
            "the reward model (or judge) on a resource pool of its own, sized n_gpus_per_node x nnodes"),
)


def expand(pattern: str) -> list[str]:
    """``a.{b,c}.d`` -> ``["a.b.d", "a.c.d"]`` (several groups multiply)."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    end = pattern.index("}", start)
    return [x for alt in pattern[start + 1:end].split(",")
            for x in expand(pattern[:start] + alt.strip() + pattern[end + 1:])]


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@lru_cache(maxsize=1)
def _defaults() -> dict:
    from pathlib import Path

    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(Path(__file__).with_name("ppo_trainer.yaml")), resolve=True)


def default_of(key: str) -> Any:
    """The key's value in ``ppo_trainer.yaml`` (interpolations resolved)."""
    return _get(_defaults(), key)


_ABSENT = object()


def _leaf_items(value: Any, key: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [item for k, v in value.items() for item in _leaf_items(v, f"{key}.{k}")]
    return [(key, value)]


def _default_or_absent(key: str) -> Any:
    try:
        return default_of(key)
    except (KeyError, AttributeError, TypeError):
        return _ABSENT


def changed_keys(cfg: Any, key: str) -> list[tuple[str, Any]]:
    """``(leaf key, value)`` of every leaf under ``key`` (or ``key`` itself) whose value differs from the defaults
    file -- not counting leaves that still follow their default interpolation (``${...}``: they changed because
    another key did)."""
    untouched = getattr(cfg, "__dict__", {}).get("_untouched_interpolations", frozenset())
    value = _get(cfg, key)
    default = _default_or_absent(key)
    if isinstance(value, dict) or isinstance(default, dict):
        value_leaves = dict(_leaf_items(value if isinstance(value, dict) else {}, key)) if value else {}
        default_leaves = dict(_leaf_items(default, key)) if isinstance(default, dict) else {}
        if not value and default_leaves and not isinstance(value, dict):
            return [(key, value)]
        return [(k, v) for k, v in value_leaves.items() if k not in untouched
                and default_leaves.get(k, _ABSENT) != v and not (v == {} and k not in default_leaves)]
    if key in untouched or value == default:
        return []
    return [(key, value)]


def _set_keys(cfg: Any, rules: tuple[KeyRule, ...]) -> list[tuple[str, Any, KeyRule]]:
    return [(leaf, value, rule) for rule in rules for key in expand(rule.key)
            for leaf, value in changed_keys(cfg, key)]


def refusal_errors(cfg: Any) -> list[str]:
    """One error per refused rule set to a value other than the one hybridflow supports (its default), naming the
    keys set."""
    by_rule: dict[int, list[str]] = {}
    for key, value, rule in _set_keys(cfg, REFUSED):
        by_rule.setdefault(id(rule), []).append(f"{key}={value!r}")
    rules = {id(r): r for r in REFUSED}
    return [f"{', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''} is not supported: {rules[i].reason}"
            for i, keys in by_rule.items()]


# leaves inside an inert node that act (the pipeline's end-stage sizes in override_transformer_config)
_ACTING_LEAVES = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")


def inert_note(cfg: Any) -> str | None:
    """One grouped note naming every inert key the command line set (``None`` when there is none)."""
    hits = [f"  {key}={value!r}: {rule.reason}" for key, value, rule in _set_keys(cfg, INERT)
            if key.rsplit(".", 1)[-1] not in _ACTING_LEAVES]
    if not hits:
        return None
    return ("these keys have no effect in hybridflow (table: docs/migrating-from-verl.md, 'Keys without effect'):\n"
            + "\n".join(hits))


def inert_keys_markdown() -> str:
    """The table of ``docs/migrating-from-verl.md``: one row per rule."""
    rows = ["| key | why it has no effect here |", "|---|---|"]
    rows += [f"| {', '.join(f'`{k}`' for k in expand(rule.key))} | {rule.reason} |" for rule in INERT]
    return "\n".join(rows)


def refused_keys_markdown() -> str:
    """The refused keys of ``docs/migrating-from-verl.md``: key, the only accepted value, why."""
    rows = ["| key | accepted value | why other values are refused |", "|---|---|---|"]
    for rule in REFUSED:
        keys = expand(rule.key)
        default = default_of(keys[0])
        accepted = "its defaults (the node unchanged)" if isinstance(default, dict) else f"`{default!r}`"
        rows.append(f"| {', '.join(f'`{k}`' for k in keys)} | {accepted} | {rule.reason} |")
    return "\n".join(rows)



def policy_of(key: str) -> str | None:
    """``alias`` (verl 0.9's spelling of a key read here), ``refused``, ``inert`` or ``acts`` (a key verl 0.9 added
    that acts here); ``None`` for the keys of the early-2026 tree, which act unless listed."""
    from hybridflow.config.aliases import canonical_key

    if canonical_key(key) != key:
        return "alias"
    for kind, rules in (("refused", REFUSED), ("inert", INERT), ("acts", ACTS)):
        for rule in rules:
            if any(key == k or key.startswith(k + ".") for k in expand(rule.key)):
                return kind
    return None
