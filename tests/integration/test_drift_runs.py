"""The drift detector on real runs (local backend, CPU fp32, the hf engine): each cause injected for real names
itself within one step and stops the run; healthy runs of every mode never trip it.

Injected faults (each a real change of the code path, patched for the run only):

* a weight sync skipped -- the synchronous mode's push after the update does nothing, so the rollout replica (its own
  copy: ``hybrid_engine=false``) generates step 2 with step 1's weights;
* temperature applied to the rollout's log-probs -- the hf sampler reports log softmax(2 x logits / T);
* top-k applied to the rollout's log-probs -- the sampler reports the log-prob renormalised over the top-k set;
* a LoRA adapter not applied -- the hf engine generates with the adapter layers disabled;
* another chat template -- the single-turn agent renders the prompt itself with a changed template.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from hybridflow.trainer.drift import DriftError

from .conftest import run, small_overrides

HERE = Path(__file__).parent
A = "actor_rollout_ref"
COMMON = ["algorithm.adv_estimator=grpo", f"custom_reward_function.path={HERE / 'reward_fns.py'}",
          "reward_model.num_workers=0"]
STANDALONE = [f"{A}.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
# the sampler's own log-probs (exact log-probs, the default on CPU, take them with the trainer's ops instead, so a
# fault injected into the sampler would not reach them)
SAMPLER_PATH = [f"{A}.rollout.exact_log_probs=false"]


def _steps(history):
    return [m for m in history.metrics if "timing_s/step" in m]


def _train(tmp_path, name, model, data, extra, steps=3):
    out = tmp_path / name
    return run(small_overrides(model, data, out, backend="local", steps=steps, extra=COMMON + extra), out)


def _named(tmp_path, name, model, data, extra, patches, steps=3) -> DriftError:
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        with pytest.raises(DriftError) as info:
            _train(tmp_path, name, model, data, extra, steps=steps)
    print(f"\ninjected fault {name}: {str(info.value).splitlines()[0]}")
    return info.value


# ---------------------------------------------------------------------------------------------- the faults
def _patched(target, name, value):
    mp = pytest.MonkeyPatch()

    class _Ctx:
        def __enter__(self):
            mp.setattr(target, name, value)

        def __exit__(self, *exc):
            mp.undo()

    return _Ctx()


def _sampler_patch(transform):
    from hybridflow.rollout.hf import batcher
    from hybridflow.rollout.hf.token_sampler import sample_next_tokens

    def patched(logits, rows, generator, steps=None, suppress=None):
        tokens, _ = sample_next_tokens(logits, rows, generator, steps, suppress)
        return tokens, transform(logits.float() * rows.inv_temperature[:, None], rows, tokens)

    return _patched(batcher, "sample_next_tokens", patched)


def _exact_path_patch(transform):
    """The same fault injected where exact log-probs are taken (``rollout/hf/exact.py``'s ``exact_sample``: the
    trainer's scaling, then the sampler): the tokens as drawn, their log-probs through ``transform``."""
    from hybridflow.rollout.hf import batcher, exact

    def patched(logits, params, sampling, generator, steps, suppress):
        tokens, _ = exact.exact_sample(logits, params, sampling, generator, steps, suppress)
        temps = [p.logprob_temperature if p is not None else 1.0 for p in params]
        return tokens, transform(exact.scaled_like_the_trainer(logits, temps), None, tokens)

    return _patched(batcher, "exact_sample", patched)


def _twice_the_temperature(scaled, rows, tokens):
    return (2 * scaled).log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)


def _top_k_renormalised(k):
    def transform(scaled, rows, tokens):
        kth = scaled.topk(k, dim=-1).values[:, -1:]
        kept = scaled.masked_fill(scaled < kth, float("-inf"))
        return kept.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)

    return transform


def _skip_weight_sync():
    from hybridflow.trainer.weight_sync import PushAfterUpdate

    return _patched(PushAfterUpdate, "after_update", lambda self, run, log: None)


def _adapter_off_in_rollout():
    from hybridflow.rollout.hf.engine import HFRolloutEngine

    wake, sleep = HFRolloutEngine.wake_up, HFRolloutEngine.sleep

    def wake_up(self):
        wake(self)
        self.model.base_model.disable_adapter_layers()

    def asleep(self):
        self.model.base_model.enable_adapter_layers()
        sleep(self)

    stack = ExitStack()
    stack.enter_context(_patched(HFRolloutEngine, "wake_up", wake_up))
    stack.enter_context(_patched(HFRolloutEngine, "sleep", asleep))
    return stack


def _another_chat_template():
    from hybridflow.agents import chat
    from hybridflow.agents.single_turn import SingleTurnAgentLoop

    render, run_loop = chat._render_text, SingleTurnAgentLoop.run

    def other(templater, messages, tools, add_generation_prompt, **kwargs):
        return render(templater, messages, tools, add_generation_prompt, **kwargs).replace("user\n", "human\n")

    async def rendered_by_the_rollout(self, sampling_params, **kwargs):
        kwargs.pop("raw_prompt_ids", None)  # the rollout renders the row itself
        return await run_loop(self, sampling_params, **kwargs)

    stack = ExitStack()
    stack.enter_context(_patched(chat, "_render_text", other))
    stack.enter_context(_patched(SingleTurnAgentLoop, "run", rendered_by_the_rollout))
    return stack


# ---------------------------------------------------------------------------------------------- tests
def test_a_skipped_weight_sync_is_caught_by_the_weight_digest_before_generating(nano_model_dir, addition_data,
                                                                                 tmp_path):
    from hybridflow.rollout.service.replica import ReplicaError

    with _skip_weight_sync(), pytest.raises(ReplicaError) as info:
        _train(tmp_path, "skip_digest", nano_model_dir, addition_data, STANDALONE)
    text = str(info.value)
    assert "rollout replica 'rollout/replica0' does not hold the trainer's weights at wake_up" in text, text


def test_a_skipped_weight_sync_is_named_by_the_drift_detector_at_the_next_step(nano_model_dir, addition_data,
                                                                               tmp_path):
    # the digests off: the drift detector is the second line and names the weights within one step
    error = _named(tmp_path, "skip", nano_model_dir, addition_data, [*STANDALONE, "trainer.drift.check_weights=false"],
                   [_skip_weight_sync()])
    assert "step 2:" in str(error) and "weights:" in str(error), str(error)
    assert error.metrics["drift/cause/weights"] == 1.0 and error.metrics["drift/tripped"] == 2.0


def test_weights_lost_across_sleep_and_wake_are_caught_at_the_wake(nano_model_dir, addition_data, tmp_path):
    from hybridflow.rollout.hf.engine import HFRolloutEngine
    from hybridflow.rollout.service.replica import ReplicaError

    wake = HFRolloutEngine.wake_up

    def wake_with_lost_weights(self):  # what an engine that discards its weights while asleep and skips the reload does
        wake(self)
        with torch.no_grad():
            for p in self.model.parameters():
                p.mul_(0.5)

    with _patched(HFRolloutEngine, "wake_up", wake_with_lost_weights), pytest.raises(ReplicaError) as info:
        _train(tmp_path, "wake", nano_model_dir, addition_data, STANDALONE)
    assert "does not hold the trainer's weights at wake_up" in str(info.value)


def test_temperature_applied_to_the_rollout_log_probs_is_named_at_step_1(nano_model_dir, addition_data, tmp_path):
    error = _named(tmp_path, "temp", nano_model_dir, addition_data, SAMPLER_PATH,
                   [_sampler_patch(_twice_the_temperature)])
    assert "step 1:" in str(error) and "sampling:" in str(error) and "temperature 0.5" in str(error), str(error)


def test_a_fault_in_the_exact_log_prob_path_is_named_at_step_1(nano_model_dir, addition_data, tmp_path):
    """Exact log-probs skip the old_log_prob pass (they are pi_old); the detector then compares them with the
    update's first forward, so a fault in the exact path itself is caught as in the sampler's."""
    exact = [f"{A}.rollout.exact_log_probs=true", f"{A}.rollout.calculate_log_probs=true"]
    error = _named(tmp_path, "exact", nano_model_dir, addition_data, exact, [_exact_path_patch(_twice_the_temperature)])
    assert "step 1:" in str(error) and "sampling:" in str(error) and "temperature 0.5" in str(error), str(error)


def test_top_k_applied_to_the_rollout_log_probs_is_named_at_step_1(nano_model_dir, addition_data, tmp_path):
    error = _named(tmp_path, "topk", nano_model_dir, addition_data, [f"{A}.rollout.top_k=5", *SAMPLER_PATH],
                   [_sampler_patch(_top_k_renormalised(5))])
    assert "step 1:" in str(error) and "sampling:" in str(error) and "top_k=5" in str(error), str(error)


def test_an_unapplied_lora_adapter_is_named(nano_model_dir, addition_data, tmp_path):
    lora = [f"{A}.model.lora_rank=8", f"{A}.model.lora_alpha=32", f"{A}.model.target_modules=all-linear",
            f"{A}.actor.use_kl_loss=true", f"{A}.actor.optim.lr=3e-2"]
    error = _named(tmp_path, "lora", nano_model_dir, addition_data, lora, [_adapter_off_in_rollout()])
    # the adapter starts as the identity (B = 0): the first update makes it matter, the next step names it
    assert "step 2:" in str(error) and "lora:" in str(error), str(error)


def test_another_chat_template_in_the_rollout_is_named_at_step_1(nano_model_dir, addition_data, tmp_path):
    error = _named(tmp_path, "template", nano_model_dir, addition_data, [], [_another_chat_template()])
    assert "step 1:" in str(error) and "template:" in str(error), str(error)
    assert error.metrics["drift/template_mismatch_fraction"] == 1.0


def test_action_warn_flags_and_names_but_trains_on(nano_model_dir, addition_data, tmp_path):
    with _sampler_patch(_twice_the_temperature):
        history = _train(tmp_path, "warn", nano_model_dir, addition_data, ["trainer.drift.action=warn",
                                                                           "trainer.report=true", *SAMPLER_PATH],
                         steps=2)
    steps = _steps(history)
    assert len(steps) == 2 and all(m["drift/tripped"] == 2.0 and m["drift/cause/sampling"] == 1.0 for m in steps)
    report = (tmp_path / "warn" / "report.html").read_text(encoding="utf-8")  # the drift panel names the cause
    assert "2 step(s) flagged" in report and "<td>1</td><td>stop</td>" in report and "<td>sampling</td>" in report
    assert "alt='Weight versions'" in report


HEALTHY = {
    "sync hf": [],
    "sync hf exact": [f"{A}.rollout.exact_log_probs=true", f"{A}.rollout.calculate_log_probs=true"],
    "sync hf, pi_old pass": [f"{A}.actor.ppo_mini_batch_size=2"],
    "sync standalone replica": STANDALONE,
    "one_step_off": [*STANDALONE, "async_training.mode=one_step_off", f"{A}.rollout.free_cache_engine=false"],
    "fully_async": [*STANDALONE, "async_training.mode=fully_async", f"{A}.rollout.calculate_log_probs=true",
                    f"{A}.rollout.free_cache_engine=false", "async_training.require_batches=1",
                    "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
                    f"{A}.actor.ppo_mini_batch_size=8"],
    "fully_async, sync every 2 steps, partial": [
        *STANDALONE, "async_training.mode=fully_async", f"{A}.rollout.calculate_log_probs=true",
        f"{A}.rollout.free_cache_engine=false", "async_training.require_batches=1", "async_training.partial_rollout=true",
        "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
        f"{A}.actor.ppo_mini_batch_size=8"],
    "v1 sync": ["trainer.use_v1=true"],
    "v1 colocate_async": ["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"],
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_runs_never_trip(name, nano_model_dir, addition_data, tmp_path):
    history = _train(tmp_path, name.replace(" ", "_").replace(",", ""), nano_model_dir, addition_data, HEALTHY[name])
    steps = _steps(history)
    assert steps and all(m["drift/tripped"] == 0.0 for m in steps)
    checked = [m for m in steps if m["drift/rows_checked"] > 0]
    assert checked, "no step compared the rollout's log-probs with the trainer's"
    gaps = [m["drift/gap"] for m in checked]
    print(f"\nhealthy drift, {name}: steps checked {len(checked)}/{len(steps)}, gap max {max(gaps):.3g}")
    if "exact" in name:
        assert max(gaps) == 0.0
    assert torch.tensor(gaps).isfinite().all()
