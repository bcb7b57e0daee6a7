"""Every model family on two FSDP2 ranks (gloo), all in one process-group start: the sharded actor's log-probs
equal an unsharded HF forward, the rollout's equal the actor's, one GRPO step trains (hf engine on the sharded
module, reward, GRPO advantages, update), and the two-rank checkpoint merges into a folder
``AutoModelForCausalLM`` loads with the trained weights' logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from multirank import run_ranks

from hybridflow.utils.tiny_model import FAMILIES, make_tiny_checkpoint

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
REWARD = HERE.parent / "integration" / "reward_fns.py"  # a dense reward: varied scores, non-zero advantages



@pytest.fixture(scope="module")
def two_rank_families(tmp_path_factory):
    from hybridflow.data.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("families_2r")
    data, models, out = root / "data", root / "models", root / "out"
    write_synthetic("addition", str(data), train_size=16, test_size=4, seed=0)
    for family in FAMILIES:
        make_tiny_checkpoint(models / family, size="nano", family=family, initializer_range=0.2)
    out.mkdir()
    run_ranks(HERE / "two_rank_families_scenario.py", 2, [data, models, out, REWARD, *FAMILIES], root / "logs",
              timeout=800)
    results = [json.loads((out / f"results_rank{r}.json").read_text()) for r in range(2)]
    return models, out, results


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_on_two_ranks(family, two_rank_families):
    _, _, results = two_rank_families
    per_rank = [r[family] for r in results]
    for rank, res in enumerate(per_rank):
        assert "error" not in res, f"rank {rank}:\n{res.get('error')}"
        assert res["sharded_params"] > 0, "the actor is not sharded"
        assert res["actor_vs_hf"] < 1e-5, f"rank {rank}: sharded actor vs unsharded HF forward {res['actor_vs_hf']:.2e}"
        assert res["rollout_vs_actor"] < 1e-5, f"rank {rank}: rollout vs actor {res['rollout_vs_actor']:.2e}"
        assert res["advantage_abs_sum"] > 0, "every GRPO advantage is zero: the step trained on nothing"
    assert per_rank[0]["changed_tensors"] >= per_rank[0]["tensors"] - 1 > 0  # rank 0 holds the full state
    m = per_rank[0]["metrics"]
    assert torch.isfinite(torch.tensor(m["actor/pg_loss"])) and m["actor/grad_norm"] > 0
    if FAMILIES[family].model_type in ("qwen3_moe", "deepseek_v3"):
        assert m["actor/moe/max_vio/max"] > 0  # expert load measured over both ranks' tokens
    print(f"\n{family}: actor-vs-HF {max(r['actor_vs_hf'] for r in per_rank):.1e}, rollout-vs-actor "
          f"{max(r['rollout_vs_actor'] for r in per_rank):.1e}, {per_rank[0]['changed_tensors']}/"
          f"{per_rank[0]['tensors']} tensors changed, {per_rank[0]['seconds']:.1f} s")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_rank_checkpoint_merges_and_loads(family, two_rank_families, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridflow.cli.merge import merge_checkpoint

    models, out, _ = two_rank_families
    step = out / family / "global_step_1"
    assert sorted(p.name for p in (step / "actor").glob("model_world_size_*")) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    merged = AutoModelForCausalLM.from_pretrained(merge_checkpoint(str(step), str(tmp_path / "merged")),
                                                  dtype=torch.float32).eval()
    config = AutoConfig.from_pretrained(models / family)
    trained = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = trained.load_state_dict(torch.load(out / family / "trained_state.pt"), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    trained.tie_weights()
    initial = AutoModelForCausalLM.from_pretrained(models / family, dtype=torch.float32).eval()
    ids = torch.randint(4, config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want, before = merged(ids).logits, trained(ids).logits, initial(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, before, atol=1e-4)
