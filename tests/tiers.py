"""The two test tiers: ``make test`` (the fast proof) and ``make test-full`` (everything else). CI runs both.

The fast tier is every test not listed here: unit tests, the fake-worker-group tests of every controller mode, and
a handful of end-to-end scenarios run once per module and checked many ways (a local GRPO run that learns, an exact
resume, the algorithms end to end, the modes on the real workers, the N-D engine's tensor/expert-parallel equality
on gloo, every model family on two FSDP ranks, Ray's worker groups).
The full tier holds the matrices: learning and Ray matrices, multi-rank scenarios, quickstarts, process-killing
fault runs, verl's example command lines run for real, benchmarks' smoke runs.

The split is a measurement: each entry is here because its module took long in a recorded run (``make test`` and
``make test-full`` print ``--durations``; ``scripts/tier_report.py`` sums a JUnit report per module and per tier).
Nothing is dropped: a test moved here still runs in CI (``.ci/run`` runs both tiers).
"""

from __future__ import annotations

import fnmatch

# paths relative to tests/ (a folder, a module, or a module::test prefix), with why they are not in the fast tier
FULL_TIER: dict[str, str] = {
    # end-to-end runs on Ray (a Ray instance and worker processes each): the fast tier keeps controller/
    # test_ray_worker_group.py (dispatch, placement and failures on Ray) and the local-backend runs
    "integration/": "end-to-end runs and their matrices (modes, recipes, VLM, verl's command lines, quickstarts)",
    "agents/test_reward_loop.py": "reward loop on Ray vs in-process (two Ray runs)",
    "agents/test_user_tool_run.py": "a user's tool class through GRPO, locally and on Ray",
    "agents/test_agent_loops.py::test_user_agent_loop_from_yaml_trains_on_ray": "the same run on Ray",
    "trainer/test_user_extensions.py::test_user_estimator_and_loss_from_their_own_file_train_two_steps[ray]": "on Ray",
    "controller/test_ray_cli_cluster.py": "a two-node `ray start` cluster",
    "controller/test_multinode.py": "multi-node Ray placement",
    "faults/test_ray_console.py": "a Ray run's console output",
    "faults/test_engine_fault_runs.py": "the real CLI run to an engine fault, one process per fault",
    "faults/test_code_reward_hacks.py": "reward hacks scored in the sandbox, one run each",
    "faults/test_resume_safety.py": "runs stopped and resumed",
    "faults/test_training_faults.py": "runs interrupted by signals",
    "faults/test_two_hosts.py": "a Ray cluster over two network namespaces, one host killed mid-run (root, ip netns)",
    "faults/test_rollout_wal_kill.py": "a fully async run killed (-9) at random points and resumed, ~3 min",
    "workers/test_ray_actor_group.py": "the actor worker group on Ray",
    "workers/test_vlm_distributed.py": "a VLM on two FSDP ranks",
    "workers/test_actor_distributed.py": "the actor on two FSDP ranks",
    "workers/test_dp_padding.py": "data-parallel padding on two ranks",
    "engine/test_compiled_kernels.py": "torch.compile of the fused kernels",
    "engine/test_sequence_parallel.py": "Ulysses equality on 2 and 4 gloo processes",
    "engine/test_fused_head.py::test_vocab_parallel_fused_head_equals_one_rank": "two gloo ranks",
    "rollout/test_exact_log_probs.py::test_rollout_log_probs_equal_the_trainers_bit_for_bit": "a process per "
    "variant (MKL's strict mode is set at a process's start)",
    "rollout/test_exact_log_probs.py::test_without_batch_invariant_kernels_they_differ_in_the_last_bits": "a process",
    "engine/test_pipeline_parallel.py::test_four_ranks": "pipeline x tp / dp / ep equality on 4 gloo processes",
    # the 4-process tensor/expert-parallel scenario (dp2xtp2, ep2xtp2 with its sabotage and checkpoints, ~50 s);
    # the fast tier keeps the 2-process one (every family's tp2, ep2, LoRA, sequence parallel, their sabotages)
    "engine/test_tensor_parallel.py::test_four_ranks": "tp/ep equality on 4 gloo processes",
    "engine/test_tensor_parallel.py::*[4ranks-*": "the same 4-process run's sabotage, resume and merge cases",
    "engine/test_mixed_precision.py::test_fsdp2_on_two_gloo_ranks_uses_the_policy": "two gloo ranks",
    "config/test_megatron_command_lines.py::test_scaled_qwen3_megatron_grpo_runs_a_step_on_ray": "a Ray run",
    "config/test_verl09_megatron_runs.py::test_scaled_megatron_launch_trains_a_step": "verl 0.9's Megatron launches, "
    "scaled to 4 processes, one step each on Ray",
    "trainer/test_main_ppo_startup.py": "Ray start-up with the driver's work in the background",
    "compat/test_sft_compat.py": "verl's SFT trainer command lines run",
    "tools/test_sandbox_fusion.py": "the SandboxFusion server and its client",
    "benchmarks/": "the benchmark scripts' smoke runs",
    "test_quiet_console.py": "the console of whole runs",
    "rollout_vllm/": "vLLM (make test-vllm)",
    "tracking/test_live_report_browser.py": "the live report in headless Chromium (Debian's chromium, .ci/run)",
    "cli/test_user_errors.py": "every command fed its bad inputs, one process each (~3 min)",
    # the verl command-line matrices (fast keeps test_megatron_keys, test_dry_run_catches, test_key_policy: the rules
    # those lines exercise, one case each)
    "config/test_verl09.py": "every verl 0.9 example launch line loaded (~30 s)",
    "config/test_verl_command_lines.py": "verl's example command lines loaded, one by one (~27 s)",
    "config/test_verl_recipe_command_lines.py": "verl's recipe command lines loaded (~23 s)",
    "config/test_recipe_keys.py": "every recipe's keys against verl's (~17 s)",
    # process-killing fault runs (fast keeps the fake-group fault tests and most of test_stall_watchdog)
    "faults/test_stuck_user_code.py": "runs stuck in user code stopped by signals, one CLI run each (~50 s)",
    "faults/test_worker_kill.py": "a Ray worker killed mid-run and the run resumed (~30 s)",
    "trainer/test_background_validation.py": "validation on its own thread in real fully async runs (~40 s)",
    # measured 2026-11-28 on the idle machine (fast tier 8:02): the rest of the config matrices and a few repeats
    # of a scenario the fast tier already runs once
    "controller/test_init_ray.py": "Ray start-up cases (a leftover cluster, the run's signal handlers), each "
    "starting Ray in the serial part (~35 s)",
    "config/test_recipe_command_lines.py": "hybridflow's recipe command lines loaded one by one (~14 s)",
    "config/test_verl09_surface.py": "verl 0.9's surface keys one by one (~11 s)",
    "config/test_verl09_megatron_runs.py": "verl 0.9's Megatron launch lines scaled (the runs, and their ~11 s of "
    "loading)",
    "config/test_rollout_engine_keys.py": "every rollout engine key loaded (~9 s)",
    "config/test_key_policy.py::test_refusals_exit_2_and_inert_keys_print_one_note": "the CLI's exit 2 as "
    "processes (~10 s; the rules run in-process in the same file)",
    "cli/test_help.py::test_every_command_answers_help_with_its_options": "`--help` of every command, one process "
    "each (~13 s; the help text itself is checked in-process in the same file)",
    "controller/test_ray_worker_group.py::test_colocated_roles_share_a_process_split_pools_do_not": "placement "
    "of colocated and split pools on Ray (~13 s)",
    "rewards/test_reward_workers.py::test_hung_scorers_time_out_together_not_one_after_another": "hung scorers "
    "waited out (~11 s)",
    "rollout/test_rollout_service.py::test_ray_replica_coalesces_a_tick_of_requests_into_one_stream": "a Ray "
    "instance of its own for one replica (~8 s; the coalescing itself is tested in-process beside it)",
    "controller/test_ray_worker_group.py::test_max_colocate_count_allows_separate_processes_per_bundle": "more "
    "Ray placement (~6 s)",
    "controller/test_ray_worker_group.py::test_threads_per_worker_sets_each_process_torch_threads": "more Ray "
    "placement (~3 s)",
    "config/test_config.py::test_cli_": "the CLI's exit codes as processes (~8 s)",
    "config/test_config_time_errors.py::test_errors_exit_2_from_the_command_line": "the CLI's exit 2 as a process",
    "faults/test_checkpoint_kill.py": "a run SIGKILLed while saving (~8 s of the serial part)",
    "rollout/test_stall_watchdog.py::test_a_weight_load_that_never_returns_is_named": "waits out a 5 s stall "
    "(serial part; the fast tier keeps the stuck-decode and decision cases)",
    "rollout/test_stall_watchdog.py::test_a_loop_blocked_by_user_code_fails_the_run_waiting_on_it": "waits out a "
    "5 s stall (serial part)",
    # scenario matrices: the fast tier keeps one case of each (separate_drop; s0.5_T2_partial; the resume with the log)
    "integration/test_v1_trainer.py::test_v1_async_staleness_never_exceeds_the_threshold[colocate_": "V1 "
    "staleness matrix",
    "integration/test_v1_trainer.py::test_v1_async_staleness_never_exceeds_the_threshold[separate_wait": "V1 "
    "staleness matrix",
    "integration/test_async_training.py::test_fully_async_staleness_never_exceeds_the_bound[s1_": "fully "
    "async staleness matrix",
    "integration/test_async_training.py::test_fully_async_staleness_never_exceeds_the_bound[s0.5_T1_wait": "fully "
    "async staleness matrix",
    "integration/test_async_training.py::test_one_step_off_resume_trains_the_same_prompts[no_rollout_wal": "the "
    "resume without the rollout log",
}

# Fast-tier scenarios kept from the folders above: one end-to-end run of each kind.
FAST_SCENARIOS: tuple[str, ...] = (
    "integration/test_learning.py",  # a local GRPO run whose reward must climb, checked many ways
    "integration/test_resume.py",  # an exact resume
    "integration/test_algorithms_local.py",  # every estimator end to end on the local backend
    "integration/test_v1_trainer.py",  # verl 0.9's V1 modes on the real workers
    "integration/test_async_training.py",  # one-step-off and fully async on the real workers
    "integration/test_examples.py",  # the shipped example scripts validate
)


def in_full_tier(rel: str) -> bool:
    """Whether the test at ``rel`` (its node id relative to tests/) runs only in ``make test-full``: an entry of
    FULL_TIER is a prefix of it, or an entry with ``*`` matches it (the other characters taken literally)."""
    if rel.startswith(FAST_SCENARIOS):  # a fast scenario's module, unless one of its tests is listed by name
        return any(rel.startswith(key) for key in FULL_TIER if "::" in key and key.startswith(FAST_SCENARIOS))
    return any(fnmatch.fnmatchcase(rel, key.replace("[", "[[]")) if "*" in key else rel.startswith(key)
               for key in FULL_TIER)
