"""Helpers of the vLLM tests (tests/rollout_vllm), importable by name: HF references, verl command lines with tiny assets."""

from __future__ import annotations

from pathlib import Path

import torch


def hf_greedy(model, prompt: list[int], max_new: int, eos: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def hf_log_probs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


VERL_LINES = Path(__file__).resolve().parent / "config" / "data" / "verl_command_lines.txt"
REWARD_FNS = Path(__file__).resolve().parent / "integration" / "reward_fns.py"


def verl_sections() -> list[tuple[str, list[str]]]:
    """(name, overrides) of verl's launch scripts recorded in tests/config/data/verl_command_lines.txt."""
    out, name, args = [], None, []
    for line in VERL_LINES.read_text().splitlines():
        if line.startswith("## "):
            if name:
                out.append((name, args))
            name, args = line[3:].strip(), []
        elif line.strip() and not line.startswith("#"):
            args.append(line.strip())
    out.append((name, args))
    return out


def tiny_assets(model_dir, data_dir, out_dir, steps: int = 2) -> list[str]:
    """Overrides appended to a verl command line (the last value of a key wins) so it runs here in seconds:
    the tiny model and local data, batch/length sizes for 2 cores, vLLM on CPU (one engine, fp32, eager,
    rollout log-probs on), the in-process backend, ``steps`` steps, file logging only."""
    a = "actor_rollout_ref"
    return [
        f"{a}.model.path={model_dir}", f"critic.model.path={model_dir}", f"reward_model.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4", "data.val_batch_size=4", "data.max_prompt_length=384",
        "data.max_response_length=16", "data.filter_overlong_prompts=true", "data.truncation=left",
        f"{a}.rollout.n=2", f"{a}.actor.ppo_mini_batch_size=2", f"{a}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{a}.actor.ppo_max_token_len_per_gpu=4096", f"{a}.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"{a}.rollout.log_prob_max_token_len_per_gpu=4096", f"{a}.ref.log_prob_micro_batch_size_per_gpu=8",
        f"{a}.ref.log_prob_max_token_len_per_gpu=4096", f"{a}.actor.optim.lr=1e-3",
        f"{a}.model.enable_gradient_checkpointing=false",
        "critic.ppo_micro_batch_size_per_gpu=4", "critic.ppo_max_token_len_per_gpu=4096",
        "critic.forward_max_token_len_per_gpu=4096", "critic.optim.lr=1e-3",
        "reward_model.micro_batch_size_per_gpu=4",
        f"{a}.rollout.tensor_model_parallel_size=1", f"{a}.rollout.data_parallel_size=1",
        f"{a}.rollout.gpu_memory_utilization=0.05", f"{a}.rollout.dtype=float32", f"{a}.rollout.enforce_eager=true",
        f"{a}.rollout.max_num_seqs=16", f"{a}.rollout.max_num_batched_tokens=1024",
        f"{a}.rollout.calculate_log_probs=true", f"{a}.rollout.agent.num_workers=1",
        f"{a}.actor.fsdp_config.model_dtype=fp32", f"{a}.ref.fsdp_config.model_dtype=fp32",
        "trainer.backend=local", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[file]", "trainer.report=false",
        f"trainer.default_local_dir={out_dir}/ckpt", "trainer.project_name=vllm_it", "trainer.experiment_name=run",
        "trainer.resume_mode=disable",
        # GSM8K exact match scores a random tiny model 0 everywhere: no advantage, no update, nothing to sync.
        # This dense score varies with every character, so every step really changes the actor.
        f"custom_reward_function.path={REWARD_FNS}", "custom_reward_function.name=compute_score_spread",
    ]




def _key(arg: str) -> str:
    return arg.lstrip("+~").partition("=")[0]


def tiny_command_line(section_args, model_dir, data_dir, out_dir, steps: int = 2, extra=()) -> list[str]:
    """A verl command line with :func:`tiny_assets` in place of its sizes and paths: the section's own values of
    those keys (and of its micro-batch keys, global or per-GPU) are dropped, everything else is kept."""
    assets = tiny_assets(model_dir, data_dir, out_dir, steps) + list(extra)
    replaced = {_key(a) for a in assets}
    kept = [a for a in section_args if _key(a) not in replaced and "micro_batch_size" not in _key(a)
            and "max_token_len" not in _key(a)]
    return kept + assets
