"""The controller's checkpoints: what a run saves after a step and restores on resume.

``global_step_N`` (``run_checkpoint.py``: atomic folders, rotation, resume discovery) holds the actor, the critic,
the roles the stage hooks train (PRIME's PRM), the data position the mode owns (``data.pt``: the loader, plus the
async modes' ledger of trained samples) and the trainer state (step, epoch, RNG, KL controller).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.trainer import run_checkpoint as ckpt

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["load_run", "save_run"]


def save_run(run: Run) -> None:
    """Atomic ``global_step_N`` (actor, critic, hooks' roles, data.pt, trainer state), then keep-last-K rotation."""
    tcfg = run.config.trainer
    root = tcfg.default_local_dir
    with ckpt.CheckpointWriter(root, run.global_steps) as writer:
        components = ["actor"]
        run.groups.actor_rollout.save_checkpoint(str(writer.tmp_dir / "actor"), run.global_steps, None)
        if run.plan.use_critic:
            run.groups.critic.save_checkpoint(str(writer.tmp_dir / "critic"), run.global_steps, None)
            components.append("critic")
        for name, group in run.hooks.trained_roles(run.groups).items():
            group.save_checkpoint(str(writer.tmp_dir / name), run.global_steps, None)
            components.append(name)
        data_state = run.mode.data_state(run)
        if data_state is not None:
            writer.save_data_state(data_state)
        writer.save_trainer_state(ckpt.TrainerState(
            global_step=run.global_steps,
            epoch=run.epoch,
            rng=ckpt.capture_rng_state(),
            kl_ctrl=run.kl_ctrl.state_dict() if run.kl_ctrl is not None else {},
        ))
        writer.commit(components, metadata=ckpt.lora_metadata(run.config.actor_rollout_ref.model))
    ckpt.rotate_checkpoints(root, "actor", tcfg.max_actor_ckpt_to_keep)
    ckpt.rotate_checkpoints(root, "critic", tcfg.max_critic_ckpt_to_keep)


def load_run(run: Run) -> bool:
    """Hold ``trainer.default_local_dir`` when the run saves (one run saves into a folder at a time: a second one
    is refused), then restore from the folder ``trainer.resume_mode`` selects; False on a fresh start."""
    tcfg = run.config.trainer
    if tcfg.save_freq > 0:
        ckpt.lock_checkpoint_dir(tcfg.default_local_dir)
    try:
        return _restore(run)
    except BaseException:
        ckpt.release_checkpoint_dir(tcfg.default_local_dir)
        raise


def _restore(run: Run) -> bool:
    tcfg = run.config.trainer
    ckpt.clean_stale_temp_dirs(tcfg.default_local_dir)
    folder = ckpt.find_resume_dir(tcfg.default_local_dir, tcfg.resume_mode, tcfg.resume_from_path)
    ckpt.check_overwrite(tcfg.default_local_dir, folder, saves=tcfg.save_freq > 0, allowed=tcfg.overwrite_checkpoints)
    if folder is None:
        run.mode.resumed(run)
        return False
    manifest = ckpt.read_manifest(folder)
    if run.plan.use_critic and "critic" not in manifest["components"]:
        raise ckpt.CheckpointError(f"{folder} has no critic checkpoint but this run uses a critic; resume from a PPO "
                                   "checkpoint or set trainer.resume_mode=disable")
    run.groups.actor_rollout.load_checkpoint(str(folder / "actor"))
    if run.plan.use_critic:
        run.groups.critic.load_checkpoint(str(folder / "critic"))
    for name, group in run.hooks.trained_roles(run.groups).items():
        if name not in manifest["components"]:
            raise ckpt.CheckpointError(f"{folder} has no {name} checkpoint but this run trains it; resume from a "
                                       "checkpoint of the same recipe or set trainer.resume_mode=disable")
        group.load_checkpoint(str(folder / name))
    state = ckpt.load_trainer_state(folder)
    run.global_steps, run.epoch = state.global_step, state.epoch
    ckpt.restore_rng_state(state.rng)
    if run.kl_ctrl is not None and state.kl_ctrl:
        run.kl_ctrl.load_state_dict(state.kl_ctrl)
    data_state = ckpt.load_data_state(folder)
    if data_state is not None:
        run.mode.restore_data_state(run, data_state)
    run.mode.resumed(run)
    return True
