"""verl-recipe's SPIN / SPPO / PRIME launch scripts, verl's on-policy distillation examples and its GenRM reward-loop
test, ported: each command line loads as written (every override lands in the key the code reads), and scaled to
this machine -- the same overrides with sizes, paths and engines replaced, nothing dropped -- passes every check of
the pipeline; the slow test trains two steps of each scaled line on the local backend.

Sources: ``data/recipe_command_lines.txt`` (verl-recipe, and verl's GenRM test as overrides) and the distillation
scripts of ``data/verl09_command_lines.txt``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.config.aliases import canonical_key

DATA = Path(__file__).parent / "data"
INTEGRATION = Path(__file__).parents[1] / "integration"
ENTRY_CONFIG = {"recipe.spin.main_spin": "spin_trainer", "recipe.sppo.main_sppo": "sppo_trainer",
                "recipe.prime.main_prime": "prime_trainer", "verl.trainer.main_ppo": None}
DISTILLATION = ("examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh",
                "examples/on_policy_distillation_trainer/run_qwen3_5_4b_fsdp.sh",
                "examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh")


def _sections(path: Path) -> dict[str, tuple[str, list[str]]]:
    out: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            name, _, entry = line[3:].partition(" :: ")
            out[name.strip()] = (entry.strip(), [])
        elif name and line.strip() and not line.startswith("#"):
            out[name][1].append(line.strip())
    return out


def command_lines() -> dict[str, tuple[str, list[str]]]:
    lines = _sections(DATA / "recipe_command_lines.txt")
    verl09 = _sections(DATA / "verl09_command_lines.txt")
    lines.update({name: verl09[name] for name in DISTILLATION})
    return lines


LINES = command_lines()


def _load(args: list[str], entry: str):
    cl = parse_command_line(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(cl.overrides, cl.config_path, cl.config_name or ENTRY_CONFIG[entry])


def _value(cfg, key: str):
    for part in key.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", sorted(LINES))
def test_ported_command_line_loads_as_written(name):
    entry, args = LINES[name]
    cfg = _load(args, entry)
    for arg in args:
        key, _, raw = arg.lstrip("+").partition("=")
        key = canonical_key(key)
        if key.startswith("ray_kwargs.ray_init.runtime_env") and raw == "null":
            continue  # a null runtime_env entry is dropped (as verl's scripts mean it)
        got = _value(cfg, key)
        if isinstance(got, bool):
            assert str(got).lower() == raw.lower(), (arg, got)
        elif isinstance(got, (int, float)) and not isinstance(got, bool) and re.fullmatch(r"[-0-9.e]+", raw):
            assert float(got) == float(raw), (arg, got)
        elif isinstance(got, str):
            assert got == raw.strip("'\""), (arg, got)
    recipe = {"spin": "spin", "sppo": "sppo", "prime": "prime"}.get(entry.split(".")[1] if entry.startswith("recipe")
                                                                    else "", None)
    assert cfg.trainer.recipe == recipe
    if name in DISTILLATION:
        assert cfg.distillation.enabled
    if "genrm" in name:
        assert cfg.uses_judge and cfg.reward_model.enable_resource_pool and cfg.reward_model.rollout.name == "vllm"


# ---------------------------------------------------------------------------------------------- scaled
def _scale_value(key: str, value: str, model: str, data: Path, out: Path) -> str | None:
    """The value of ``key`` scaled to this machine (``None``: keep the command line's)."""
    a = "actor_rollout_ref"
    fixed = {
        "data.train_files": str(data / "train.parquet"), "data.val_files": str(data / "test.parquet"),
        "data.train_batch_size": "8", "data.val_batch_size": "16", "data.max_prompt_length": "32",
        "data.max_response_length": "4", f"{a}.model.path": model, "reward_model.model.path": model,
        f"{a}.actor.ppo_mini_batch_size": "4", f"{a}.actor.ppo_micro_batch_size": "4",
        f"{a}.actor.ppo_micro_batch_size_per_gpu": "4", f"{a}.rollout.log_prob_micro_batch_size": "16",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu": "16", f"{a}.ref.log_prob_micro_batch_size": "16",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu": "16", f"{a}.actor.ppo_max_token_len_per_gpu": "512",
        f"{a}.rollout.log_prob_max_token_len_per_gpu": "512", f"{a}.rollout.name": "hf",
        f"{a}.rollout.tensor_model_parallel_size": "1", f"{a}.rollout.max_model_len": "36",
        f"{a}.model.enable_gradient_checkpointing": "false", f"{a}.actor.use_torch_compile": "false",
        f"{a}.actor.optim.lr": "1e-3", "reward_model.micro_batch_size_per_gpu": "8", "reward_model.mini_batch_size": "4",
        "reward_model.model.optim.lr": "1e-3", "reward_model.n_gpus_per_node": "1", "reward_model.rollout.name": "hf",
        "reward_model.rollout.tensor_model_parallel_size": "1", "reward_model.rollout.prompt_length": "128",
        "reward_model.rollout.response_length": "4", "reward_model.num_workers": "0",
        "custom_reward_function.path": str(INTEGRATION / "judge_fns.py"), "custom_reward_function.name": "ask_judge",
        "reward_model.reward_manager": "naive",  # dapo's overlong penalty needs responses longer than 4 tokens
        "trainer.n_gpus_per_node": "1", "trainer.logger": "[file]", "trainer.val_before_train": "false",
        "trainer.test_freq": "-1", "trainer.save_freq": "-1", "trainer.total_epochs": "2",  # PRIME: 1 step an epoch
        "distillation.n_gpus_per_node": "1",
    }
    if key in fixed:
        return fixed[key]
    m = re.fullmatch(r"distillation\.teacher_models\.(\w+)\.(model_path|key|inference\.tensor_model_parallel_size|"
                     r"inference\.max_model_len)", key)
    if m:
        teacher, field = m.groups()
        return {"model_path": model, "inference.tensor_model_parallel_size": "1", "inference.max_model_len": "36",
                "key": {"gsm8k": "synthetic/addition", "geo3k": "synthetic/addition_fixed"}.get(teacher)}[field]
    return None


def scaled(name: str, model: str, data: Path, out: Path) -> tuple[str, list[str]]:
    """The command line with its sizes, paths and engines replaced, plus what this machine needs on top."""
    entry, args = LINES[name]
    result = []
    for arg in args:
        raw_key, _, value = arg.partition("=")
        new = _scale_value(canonical_key(raw_key.lstrip("+")), value, model, data, out)
        result.append(arg if new is None else f"{raw_key}={new}")
    extra = ["trainer.device=cpu", "trainer.backend=local", "trainer.total_training_steps=2", "trainer.report=false",
             f"trainer.default_local_dir={out / 'ckpt'}", "data.seed=1", "trainer.seed=1"]
    has = {canonical_key(a.partition("=")[0].lstrip("+")) for a in args}
    a = "actor_rollout_ref"
    for key in ("data.train_files", "data.val_files", "data.train_batch_size", "data.max_prompt_length",
                "data.max_response_length", f"{a}.actor.ppo_mini_batch_size",
                f"{a}.rollout.log_prob_micro_batch_size_per_gpu", f"{a}.ref.log_prob_micro_batch_size_per_gpu"):
        # a line that leaves the size to the defaults (verl's GenRM test) gets this machine's
        if key not in has and key.replace("_per_gpu", "") not in has:
            extra.append(f"{key}={_scale_value(key, '', model, data, out)}")
    if "custom_reward_function.path" not in has:  # the addition task's exact rule (PRIME: a graded share)
        extra += [f"custom_reward_function.path={INTEGRATION / 'reward_fns.py'}", "reward_model.num_workers=0"]
        if entry == "recipe.prime.main_prime":
            extra.append("custom_reward_function.name=compute_digit_share")
    if "distillation.teacher_models.gsm8k.key" in has:  # two teachers (one process each): rows of both sources
        extra += ["data.shuffle=true", "distillation.n_gpus_per_node=2"]
    return entry, result + extra


@pytest.fixture(scope="module")
def two_source_data(tmp_path_factory):
    """The addition task under two data sources (synthetic/addition and synthetic/addition_fixed), for MOPD."""
    from hybridflow.data.io import write_parquet
    from hybridflow.data.synthetic import make_rows

    d = tmp_path_factory.mktemp("two_sources")
    rows = make_rows("addition", 16, 0, "train") + make_rows("addition_fixed", 16, 0, "train")
    write_parquet(rows, str(d / "train.parquet"))
    write_parquet(rows[:8] + rows[16:24], str(d / "test.parquet"))
    return d


@pytest.mark.parametrize("name", sorted(LINES))
def test_ported_command_line_scaled_passes_every_check(name, nano_model_dir, two_source_data, tmp_path):
    from hybridflow.launch.config import check_for_run

    entry, args = scaled(name, nano_model_dir, two_source_data, tmp_path)
    cfg = _load(args, entry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_for_run(cfg, logger_dir=str(tmp_path))
    assert cfg.trainer.total_training_steps == 2 and cfg.actor_rollout_ref.rollout.name == "hf"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LINES))
def test_ported_command_line_scaled_trains_two_steps(name, nano_model_dir, two_source_data, tmp_path):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    entry, args = scaled(name, nano_model_dir, two_source_data, tmp_path)
    cfg = _load(args, entry)
    history = train_ppo(cfg, logger=Tracking("it", "run", default_backend=["file"], output_dir=tmp_path))
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert len(steps) == 2 and all(m["actor/grad_norm"] > 0 for m in steps), name
    if entry == "recipe.spin.main_spin":
        assert all(m["actor/dpo_pairs"] > 0 and "timing_s/update_ref" in m for m in steps)
    if entry == "recipe.prime.main_prime":
        assert all(m["reward_model/grad_norm"] > 0 for m in steps)
    if name in DISTILLATION:
        assert all("timing_s/teacher" in m for m in steps)
    if "genrm" in name:
        assert all(m["judge/completed"] > 0 for m in steps)
