"""One line for the keys that no row of the config reference, no key-policy rule and no comment in ppo_trainer.yaml
describes (``hybridflow train --help NODE``); a key here covers its subtree. Part of the config reference's source
(:mod:`hybridflow.cli.config_reference`)."""

from __future__ import annotations

_PRIME = "PRIME (trainer.recipe=prime): "
EXTRA_LINES: dict[str, str] = {
    "actor_rollout_ref.model.fused_kernel_options.chunk_size": "rows of the fused LM head computed at once (0: as "
                                                               "many as 128 MB of logits); >= 0.",
    "actor_rollout_ref.actor.use_fused_kernels": "follows actor_rollout_ref.model.use_fused_kernels: the actor's LM "
                                                 "head fused with its log-softmax, in chunks (engine/fused_head.py).",
    "data.validation_shuffle": "shuffle the validation set's order (false: file order).",
    "data.filter_accuracy": _PRIME + "train first on the prompts whose accuracy lies within the bounds below.",
    "data.accuracy_lower_bound": _PRIME + "lowest accuracy of a prompt group kept first.",
    "data.accuracy_upper_bound": _PRIME + "highest accuracy of a prompt group kept first.",
    "data.oversample_factor": _PRIME + "prompts drawn per prompt trained (>= 1).",
    "data.filter_truncate": _PRIME + "prompts whose responses hit the length limit go last.",
    "data.image_key": "column holding a row's images (vision-language models).",
    "data.video_key": "column holding a row's videos (vision-language models).",
    "data.return_multi_modal_inputs": "keep the processor's pixel tensors with each row (vision-language models).",
    "data.tool_config_path": "follows actor_rollout_ref.rollout.multi_turn.tool_config_path (the tools a row may call).",
    "actor_rollout_ref.hybrid_engine": "true: the rollout lives in the actor's worker; false: standalone replicas on "
                                       "the pool rollout.nnodes x rollout.n_gpus_per_node.",
    "actor_rollout_ref.nccl_timeout": "seconds a collective (NCCL on GPU, gloo on CPU) may wait before the run fails.",
    "actor_rollout_ref.model.tokenizer_path": "take the tokenizer from this folder instead of model.path.",
    "actor_rollout_ref.model.custom_chat_template": "a Jinja chat template replacing the tokenizer's own.",
    "actor_rollout_ref.actor.freeze_vision_tower": "vision-language models: keep the vision tower's weights fixed.",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": "clip_cov loss: the share of tokens whose gradient is cut.",
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": "clip_cov loss: lower bound of the covariance band.",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": "clip_cov loss: upper bound of the covariance band.",
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": "kl_cov loss: the share of tokens given the KL penalty.",
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": "kl_cov loss: the KL penalty's coefficient.",
    "actor_rollout_ref.actor.use_remove_padding": "follows model.use_remove_padding; set it to differ for the actor.",
    "actor_rollout_ref.actor.optim.clip_grad": "verl's other spelling of actor.grad_clip (used when grad_clip is "
                                               "left at its default).",
    "actor_rollout_ref.actor.optim.override_optimizer_config": "keyword arguments passed last to the optimizer class.",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": "all-gather the next FSDP2 unit during the current one's "
                                                            "forward.",
    "actor_rollout_ref.ref.model": "the reference's own model node (null: the actor's model).",
    "actor_rollout_ref.rollout.prompt_length": "follows data.max_prompt_length.",
    "actor_rollout_ref.rollout.response_length": "follows data.max_response_length: the generation cap.",
    "actor_rollout_ref.rollout.ignore_eos": "never stop at the end-of-sequence token (fixed-length benchmarks).",
    "actor_rollout_ref.rollout.enforce_eager": "vLLM / SGLang: no CUDA graphs.",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": "vLLM: batch sizes captured as CUDA graphs (GPU only).",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "vLLM / SGLang: GPUs one rollout replica spans (1 on CPU).",
    "actor_rollout_ref.rollout.data_parallel_size": "vLLM: data-parallel ranks inside a replica (1 on CPU).",
    "actor_rollout_ref.rollout.expert_parallel_size": "vLLM: expert-parallel ranks inside a replica (1 on CPU).",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": "vLLM: pipeline stages of a replica (1 on CPU).",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "vLLM / SGLang: split long prefills into chunks.",
    "actor_rollout_ref.rollout.load_format": "vLLM / SGLang: how the engine loads its first weights (dummy: the "
                                             "actor's are pushed before the first step).",
    "actor_rollout_ref.rollout.layered_summon": "verl's FSDP1 weight gathering layer by layer; hybridflow's weight "
                                                "sync does not read it.",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "verl's staged wake-up of the inference engine; hybridflow's "
                                                     "fleets do not read it.",
    "actor_rollout_ref.rollout.disable_log_stats": "vLLM: no engine statistics in the log.",
    "actor_rollout_ref.rollout.exact_log_probs": "hf engine: the rollout's log-probs computed like the actor's "
                                                 "forward (needs calculate_log_probs, sp=1).",
    "actor_rollout_ref.rollout.engine_kwargs": "extra arguments for the engine named by rollout.name.",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.delta": "send only the tensors whose bytes changed "
                                                                      "since the last sync.",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": "verl's older spelling of "
                                                                 "checkpoint_engine.update_weights_bucket_megabytes.",
    "actor_rollout_ref.rollout.skip_tokenizer_init": "vLLM: the engine is token-in/token-out.",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": "MoE routing replay; hybridflow does not read it.",
    "actor_rollout_ref.rollout.quantization": "vLLM: the quantization method of the rollout's weights.",
    "actor_rollout_ref.rollout.multi_turn.enable": "rows without an agent_name column run tool_agent.",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "model turns per trajectory (null: no limit).",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": "tool rounds + user replies per trajectory (null: no limit).",
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": "tool calls run per turn; later ones in the turn are "
                                                               "ignored.",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": "an observation is cut to this many characters.",
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": "which end of a long observation is kept: "
                                                                        "left, right or both (middle).",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": "the tool YAML (docs/agents.md).",
    "actor_rollout_ref.rollout.multi_turn.function_tool_path": "a Python file of @function_tool functions.",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "the interaction YAML: simulated users.",
    "actor_rollout_ref.rollout.multi_turn.format": "tool-call syntax (hermes, gpt-oss, qwen3_coder, glm, ...).",
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "strict: incremental ids must equal one "
                                                                           "render of the conversation.",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "refused: an option of verl's retired SGLang "
                                                                        "multi-turn rollout.",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "refused: an option of verl's retired SGLang "
                                                                "multi-turn rollout.",
    "actor_rollout_ref.rollout.agent.num_workers": "agent-loop workers (null: one per 256 trajectories in flight).",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "the agent loop of rows without an agent_name column.",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "a YAML naming your agent loops (name, _target_).",
    "actor_rollout_ref.rollout.agent.custom_async_server": "refused: engines are chosen by rollout.name.",
    "critic.forward_max_token_len_per_gpu": "token budget of a value-pass micro-batch (with use_dynamic_bsz).",
    "critic.forward_micro_batch_size": "deprecated global form of forward_micro_batch_size_per_gpu.",
    "critic.forward_micro_batch_size_per_gpu": "trajectories per value-pass forward per device.",
    "critic.cliprange_value": "value clipping range of the value loss.",
    "critic.model.tokenizer_path": "the tokenizer the critic reads the actor's tokens with.",
    "reward_model.model.input_tokenizer": "the actor's tokenizer: responses are detokenized with it and retokenized "
                                          "for the reward model when the two differ.",
    "reward_model.model.ref_type": _PRIME + "the implicit PRM's reference (freeze).",
    "reward_model.model.beta_train": _PRIME + "the implicit PRM's beta (> 0).",
    "reward_model.model.loss_type": _PRIME + "the implicit PRM's loss (ce).",
    "reward_model.model.tokenizer_path": "the reward model's tokenizer (null: its model.path).",
    "reward_model.model.optim.grad_clip": _PRIME + "max gradient norm of the implicit PRM's update.",
    "reward_model.micro_batch_size": "deprecated global form of micro_batch_size_per_gpu.",
    "reward_model.micro_batch_size_per_gpu": "sequences per reward-model forward per device.",
    "reward_model.max_length": "longest sequence the reward model reads (null: no limit).",
    "reward_model.forward_max_token_len_per_gpu": "token budget of a reward-model micro-batch (with use_dynamic_bsz).",
    "reward_model.use_reward_loop": "score each trajectory in the agent loop as it finishes (per-sample managers).",
    "reward_model.sandbox_fusion": "code rewards: a SandboxFusion service (url), its concurrency and memory limit "
                                   "(see docs/sandbox.md).",
    "reward_model.judge.max_concurrent": "the judge's requests in flight at once.",
    "reward_model.judge.max_rpm": "judge requests per minute (null: no limit).",
    "reward_model.judge.max_tpm": "judge tokens per minute, prompt and generated (null: no limit).",
    "reward_model.mini_batch_size": _PRIME + "prompts per implicit-PRM update.",
    "custom_reward_function.name": "the function in custom_reward_function.path to score with.",
    "algorithm.dpo_label_smoothing": "SPIN (trainer.recipe=spin): label smoothing of the DPO loss, in [0, 0.5).",
    "algorithm.reward_gt_coef": _PRIME + "weight of the outcome labels' RLOO advantage.",
    "algorithm.reward_dpo_coef": _PRIME + "weight of the implicit PRM's advantage.",
    "trainer.project_name": "the run's project: names the output folder and the loggers' project.",
    "trainer.experiment_name": "the run's name within its project.",
    "trainer.seed": "seeds the run's random generators (data order has data.seed).",
    "ray_kwargs.ray_init": "arguments passed to ray.init (address, num_cpus, runtime_env...).",
    "ray_kwargs.timeline_json_file": "write Ray's task timeline (chrome://tracing JSON) here at the end of a Ray run.",
    "rollout.nnodes": "nodes of the standalone rollout pool (hybrid_engine=false).",
    "rollout.n_gpus_per_node": "devices per node of the standalone rollout pool (hybrid_engine=false).",
    "rollout.total_epochs": "fully async: passes over the data the rollouter makes.",
    "rollout.test_freq": "fully async: validation every test_freq weight versions.",
    "async_training.use_trainer_do_validate": "refused when true: validation runs on the rollout replicas.",
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": "overlap the next bucket's broadcast with "
                                                                      "loading the current one (a second buffer).",
}
