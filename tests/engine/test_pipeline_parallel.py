"""Pipeline parallelism: the stage split, and equality with the unsharded model on 2 and 4 gloo processes
(``pp_scenario.py``, one process-group start per world size).

For every case -- pp2 (1F1B) on Qwen2 (tied embeddings: the first stage's embedding and the last stage's head
are copies whose gradients are summed), GPipe on Llama-3.1, two virtual stages per rank (interleaved 1F1B), verl's
``num_layers_in_first_pipeline_stage``, the packed layout, a critic, LoRA, and with four ranks pp2 x tp2,
pp2 x dp2, pp2 x ep2 (Qwen3-MoE), a packed pp2 x dp2 critic and pp2 x sp2 (Ulysses inside every stage, the
hidden states between stages being each rank's slice of the packed row; actor and critic) -- the last stage's log-probs, entropies or values,
every parameter's gradient, the global gradient norm and the parameters after one clipped AdamW step equal a plain
single-process pass over the whole batch within 1e-5 (fp32).  A pp2 checkpoint resumes on pp2, on two data ranks
and unsharded, and ``hybridflow merge`` turns it into the trained HF model.  Five sabotages (a stage boundary off
by one, the loss scaled twice by torch's schedule, the tied embedding's gradients not summed, the outputs read
from the first stage, every sequence-parallel rank on the first slice) each move a result by > 1e-3.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from multirank import run_ranks

from hybridflow.engine.parallel.pipeline import PipelineError, stage_layer_ranges

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-5


def _scenario():
    spec = importlib.util.spec_from_file_location("hf_test_pp_scenario", HERE / "pp_scenario.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- the split
def test_stage_layer_ranges_split_evenly_or_as_verl_keys_say():
    assert stage_layer_ranges(8, 2) == [range(0, 4), range(4, 8)]
    assert stage_layer_ranges(8, 4, first=1, last=1) == [range(0, 1), range(1, 4), range(4, 7), range(7, 8)]
    assert stage_layer_ranges(7, 2, first=3) == [range(0, 3), range(3, 7)]
    assert stage_layer_ranges(4, 1) == [range(4)]


def test_the_data_parallel_peers_under_pipeline_stages_are_not_the_world():
    """The loss normalisers (tokens, sequences) are summed over the dp peers; the pp peers of a rank hold the same
    rows, so with pp x dp the sum is not over the world (it was: the loss, and so every gradient, of a pp2 x dp2
    actor was half the unsharded one -- Adam's first step hid it, the gradient norm did not)."""
    from hybridflow.engine.parallel_dims import ParallelDims

    assert ParallelDims(world=4).every_rank_a_dp_peer
    assert not ParallelDims(world=4, pp=2).every_rank_a_dp_peer
    assert not ParallelDims(world=4, tp=2).every_rank_a_dp_peer
    assert not ParallelDims(world=4, sp=2).every_rank_a_dp_peer


@pytest.mark.parametrize("args,match", [((7, 2), "cannot be split into 2 stages"),
                                        ((4, 2, 4), "would hold no layer|cannot be split"),
                                        ((8, 4, 1, 2), "cannot be split into 4 stages")])
def test_impossible_splits_are_refused_naming_the_keys(args, match):
    with pytest.raises(PipelineError, match=match):
        stage_layer_ranges(*args, key="actor_rollout_ref.actor.megatron.pipeline_model_parallel_size")


# ---------------------------------------------------------------------------------------------- N processes
@pytest.fixture(scope="module")
def pp_models(tmp_path_factory):
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("pp_models")
    scenario = _scenario()
    families = {c[0] for cases in scenario.CASES.values() for c in cases.values()}
    families |= {f for cases in scenario.CHECKPOINTS.values() for f in cases.values()}
    models = {f: str(make_tiny_checkpoint(root / f, size="nano", family=f, num_hidden_layers=4,
                                          initializer_range=0.2)) for f in sorted(families)}
    path = root / "models.json"
    path.write_text(json.dumps(models))
    return path


def _run(world: int, models: Path, out_dir: Path) -> dict:
    out = out_dir / f"pp_{world}.json"
    run_ranks(HERE / "pp_scenario.py", world, [models, out, "breaks"], out_dir)
    return json.loads(out.read_text())["results"]


@pytest.fixture(scope="module")
def two_ranks_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pp2")


@pytest.fixture(scope="module")
def two_ranks(pp_models, two_ranks_dir):
    return _run(2, pp_models, two_ranks_dir)


@pytest.fixture(scope="module")
def four_ranks(pp_models, tmp_path_factory):
    return _run(4, pp_models, tmp_path_factory.mktemp("pp4"))


def _assert_equal_to_unsharded(name: str, r: dict) -> None:
    print(f"\n{name}: " + json.dumps({k: float(f"{v:.3g}") for k, v in r.items()}))
    assert r["params"] > 0, f"{name}: the stages together do not hold every parameter of the model"
    assert r["grad_scale"] > 1e-2 and r["step_size"] > 1e-4, (name, r)  # real gradients, a real step
    assert r["missing_grads"] == 0, f"{name}: parameters of a stage got no gradient"
    for key in ("out", "entropy", "grad", "grad_norm_diff", "param_after_step"):
        assert r[key] <= TOLERANCE, f"{name} {key}: max abs diff {r[key]:.3g} > {TOLERANCE}"


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_scenario().CASES[2]))
def test_two_ranks_equal_the_unsharded_model(case, two_ranks):
    _assert_equal_to_unsharded(case, two_ranks[case])


def test_the_first_stage_holds_what_the_split_keys_say(two_ranks):
    # 4 layers: an even split puts 2 on each stage; num_layers_in_first_pipeline_stage=1 puts 1 on the first, and
    # the max over ranks of the parameters a rank holds is then the second stage's (3 layers and the head)
    even, split = two_ranks["pp2-gpipe-llama3.1"], two_ranks["pp2-split1-llama3.1"]
    assert split["stage_params"] > even["stage_params"]


def test_virtual_stages_put_two_stages_on_each_rank(two_ranks):
    assert two_ranks["pp2-vpp2-qwen2"]["stages_per_rank"] == 2 and two_ranks["pp2-qwen2"]["stages_per_rank"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_scenario().CASES[4]))
def test_four_ranks_equal_the_unsharded_model(case, four_ranks):
    _assert_equal_to_unsharded(case, four_ranks[case])


def _assert_broken(sabotage: str, results: dict) -> None:
    case = _scenario().BREAKS[sabotage][1]
    r = results[f"{sabotage}:{case}"]
    print(f"\n{sabotage} on {case}: " + json.dumps({k: float(f"{v:.3g}") for k, v in r.items()}))
    assert max(r[k] for k in ("out", "entropy", "grad", "grad_norm_diff", "param_after_step")) > 1e-3, r


def _breaks(world: int) -> list[str]:
    return sorted(n for n, (_, case) in _scenario().BREAKS.items() if case in _scenario().CASES[world])


@pytest.mark.slow
@pytest.mark.parametrize("sabotage", _breaks(2))
def test_each_sabotage_breaks_the_equality(sabotage, two_ranks):
    _assert_broken(sabotage, two_ranks)


@pytest.mark.slow
@pytest.mark.parametrize("sabotage", _breaks(4))
def test_four_ranks_sabotage_breaks_the_equality(sabotage, four_ranks):
    _assert_broken(sabotage, four_ranks)


@pytest.mark.slow
def test_a_pp2_checkpoint_resumes_on_pp2_pp1_and_one_process(two_ranks):
    r = two_ranks["ckpt-pp2-qwen2"]
    print("\nckpt-pp2-qwen2: " + json.dumps({k: float(f"{v:.3g}") for k, v in r.items()}))
    assert r["step_size"] > 1e-4
    for target in ("same", "pp1", "single"):
        assert r[f"{target}:params"] == 0.0, (target, r)
        assert r[f"{target}:next_step"] <= TOLERANCE, (target, r)


@pytest.mark.slow
def test_merge_turns_a_pp2_checkpoint_into_the_trained_hf_model(two_ranks, two_ranks_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from hybridflow.cli.merge import merge_checkpoint

    folder = two_ranks_dir / "ckpt-pp2-qwen2"
    expected = torch.load(folder / "expected.pt")
    model = AutoModelForCausalLM.from_pretrained(merge_checkpoint(str(folder), str(tmp_path / "hf")))
    got = model.state_dict()
    assert set(expected) <= set(got)
    assert all(torch.equal(got[k].detach(), expected[k]) for k in expected)
