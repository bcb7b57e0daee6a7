"""A user's own advantage estimator and policy loss, registered from their own file through trainer.import_modules,
are found by name by ``hybridflow train`` -- on the controller and in every worker process (Ray included)."""

from __future__ import annotations

import os
import sys

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.utils.user_modules import ENV_IMPORT_MODULES
from run_helpers import run, small_overrides

USER_FILE = '''
"""A user's extensions: a GRPO variant and a clipped loss, each writing which process ran it."""
import os

from hybridflow.algorithms import get_adv_estimator_fn, get_policy_loss_fn, register_adv_est, register_policy_loss


def _mark(what):
    with open(os.environ["MY_ALGOS_LOG"], "a") as f:
        f.write(f"{what} {os.getpid()}\\n")


@register_adv_est("my_grpo")
def my_grpo(**kwargs):
    _mark("adv")
    return get_adv_estimator_fn("grpo")(**kwargs)


@register_policy_loss("my_clip")
def my_clip(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None):
    _mark("loss")
    return get_policy_loss_fn("vanilla")(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                         rollout_is_weights)
'''


@pytest.fixture()
def user_algos(tmp_path, monkeypatch):
    """The user's file (outside the repository's packages) and the log its functions append to."""
    from hybridflow.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    folder = tmp_path / "user"
    folder.mkdir()
    path = folder / "my_algos.py"
    path.write_text(USER_FILE)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("MY_ALGOS_LOG", str(log))
    monkeypatch.delenv(ENV_IMPORT_MODULES, raising=False)
    yield path, log
    os.environ.pop(ENV_IMPORT_MODULES, None)  # written by the run for its workers
    for registry, name in ((ADV_ESTIMATOR_REGISTRY, "my_grpo"), (POLICY_LOSS_REGISTRY, "my_clip")):
        registry._items.pop(name, None)
    for mod in [m for m in sys.modules if m.startswith("hybridflow_user_my_algos_")]:
        del sys.modules[mod]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("ext_data")
    write_synthetic("addition", str(d), train_size=16, test_size=8, seed=0)
    return d


def _calls(log) -> list[tuple[str, int]]:
    return [(what, int(pid)) for what, pid in (line.split() for line in log.read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_user_estimator_and_loss_from_their_own_file_train_two_steps(backend, user_algos, data_dir, nano_model_dir,
                                                                     tmp_path):
    path, log = user_algos
    overrides = small_overrides(nano_model_dir, data_dir, tmp_path, backend=backend, steps=2, n=2, batch=8, extra=[
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=my_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=my_clip",
        f"trainer.import_modules=[{path}]", "reward_model.num_workers=0"])
    history = run(overrides, tmp_path / "logs")
    assert len(history.metrics) == 2
    calls = _calls(log)
    adv = [pid for what, pid in calls if what == "adv"]
    loss = [pid for what, pid in calls if what == "loss"]
    assert adv == [os.getpid(), os.getpid()]  # the advantage stage runs on the controller, once per step
    assert loss, "the user's policy loss never ran"
    if backend == "local":
        assert set(loss) == {os.getpid()}
    else:  # the update runs in the Ray workers, which imported the user's file themselves
        assert os.getpid() not in loss and len(set(loss)) == 2  # trainer.n_gpus_per_node=2 worker processes


def test_a_missing_user_module_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.import_modules=[no_such_user_module_xyz]"])
    msg = str(e.value)
    assert "trainer.import_modules[0]='no_such_user_module_xyz': cannot import module 'no_such_user_module_xyz'" in msg
    with pytest.raises(ConfigError, match=r"trainer.import_modules\[1\]='.*nope.py' does not exist"):
        load_config(["trainer.import_modules=[json,{}]".format(tmp_path / "nope.py")])


def test_a_name_the_user_module_did_not_register_lists_what_is_registered(user_algos):
    path, _ = user_algos
    cfg = load_config([f"trainer.import_modules=[{path}]", "algorithm.adv_estimator=my_grpo",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    assert cfg.algorithm.adv_estimator == "my_grpo"
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator='my_grp0'.*Did you mean 'my_grpo'"):
        load_config([f"trainer.import_modules=[{path}]", "algorithm.adv_estimator=my_grp0",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])


def test_verl_external_modules_variable_is_honoured(tmp_path, monkeypatch):
    """verl's VERL_USE_EXTERNAL_MODULES (comma-separated modules) is imported like trainer.import_modules."""
    import subprocess

    (tmp_path / "verl_style_ext.py").write_text(
        "from hybridflow.algorithms import register_policy_loss, get_policy_loss_fn\n"
        "register_policy_loss('verl_style')(get_policy_loss_fn('vanilla'))\n")
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="verl_style_ext",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code = ("import hybridflow\nfrom hybridflow.algorithms import POLICY_LOSS_REGISTRY\n"
            "print('verl_style' in POLICY_LOSS_REGISTRY)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
