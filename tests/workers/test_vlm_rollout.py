"""Vision-language rollouts end to end on one rank (tiny Qwen2-VL, fp32): dataset rows with images -> agent
loop -> hf engine (pixels + M-RoPE) -> rollout batch -> the actor recomputes the same log-probs (<= 1e-5).

Also a tool trajectory whose tool (``image_zoom_in_tool``) returns a cropped image: its observation tokens
(expanded image placeholders), mask, images and recomputed log-probs."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow.agents import DictConfigWrap
from hybridflow.agents.postprocess import outputs_to_batch
from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager
from hybridflow.engine.transformers_adapter import reset_rope_deltas

P, R = 64, 12


@pytest.fixture(scope="module")
def vision_data(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_rows")
    write_vision_task("shape_color", str(d), train_size=6, test_size=2, seed=3, size=48)
    return d


@pytest.fixture(scope="module")
def worker(varied_vlm_dir):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    from .conftest import make_config

    cfg = make_config(varied_vlm_dir, f"data.max_prompt_length={P}", f"data.max_response_length={R}",
                      "actor_rollout_ref.rollout.calculate_log_probs=true", "reward_model.use_reward_loop=false",
                      "actor_rollout_ref.rollout.agent.num_workers=1")
    w = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    w.init_model()
    w.full_config = cfg
    return w


def _actor_log_probs(worker, batch, drop_pixels=False):
    batch = batch.select(batch_keys=["prompts", "responses", "input_ids", "attention_mask", "position_ids",
                                     "response_mask"],
                         non_tensor_batch_keys=[] if drop_pixels else ["multi_modal_inputs"])
    batch.meta_info["temperature"] = 1.0
    return worker.compute_log_prob(batch).batch["old_log_probs"]


def test_rollout_log_probs_with_images_equal_the_actors(worker, vision_data):
    """Dataset -> single-turn agent loops -> engine with the rows' images; the actor's recomputation with the
    batch's multi_modal_inputs and (B, 4, L) positions agrees within 1e-5 on every response token."""
    from hybridflow.agents import AgentLoopManager
    from hybridflow.data.collate import collate_fn
    from hybridflow.data.rl_dataset import create_rl_dataset
    from hybridflow.rollout.service.fleet import ServerFleet
    from hybridflow.rollout.service.server import RolloutServer
    from hybridflow.trainer.stages import WorkerGroups, generate, prompts_from_loader

    cfg = worker.full_config
    data = create_rl_dataset(str(vision_data / "train.parquet"), cfg.data, worker.tokenizer, processor=worker.processor)
    prompts = prompts_from_loader(collate_fn([data[i] for i in range(4)]))
    engine = HFRolloutEngine(worker.actor_engine.module, worker.tokenizer, processor=worker.processor, seed=1)
    fleet = ServerFleet([RolloutServer(engine, name="vlm")])
    try:
        manager = AgentLoopManager(cfg, fleet, "local", worker.tokenizer, worker.processor)
        batch = generate(WorkerGroups(actor_rollout=None, rollout=manager), prompts, {"global_steps": 1})
    finally:
        fleet.shutdown()
    assert batch.batch["position_ids"].shape == (8, 4, P + R)  # n=2 samples per prompt
    mm = batch.non_tensor_batch["multi_modal_inputs"]
    assert all(tuple(m["image_grid_thw"].tolist()[0]) == (1, 6, 6) for m in mm)  # 48x48 images, 9 tokens each
    mask = batch.batch["response_mask"].bool()
    assert mask.sum() > 8
    rollout = batch.batch["rollout_log_probs"]
    actor = _actor_log_probs(worker, batch)
    torch.testing.assert_close(actor[mask], rollout[mask], rtol=0, atol=1e-5)
    blind = _actor_log_probs(worker, batch, drop_pixels=True)  # the comparison can fail: pixels matter
    assert (blind[mask] - rollout[mask]).abs().max() > 1e-3


class _ScriptedFirstTurn(RolloutReplica):
    """Turn 1: a fixed tool call (its log-probs from a full forward with the images, as if sampled);
    later turns: the real engine with the trajectory's images."""

    name = "scripted+engine"

    def __init__(self, engine, model, processor, text):
        self.engine, self.model, self.processor, self.text = engine, model, processor, text
        self.calls = []

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None):
        images = list((multi_modal_data or {}).get("images") or [])
        self.calls.append((list(prompt_ids), images))
        if len(self.calls) > 1:
            return await self.engine.generate(prompt_ids, sampling_params, request_id, multi_modal_data)
        tok = self.processor.tokenizer
        ids = tok.encode(self.text, add_special_tokens=False) + [tok.eos_token_id]
        full = torch.tensor([list(prompt_ids) + ids])
        pixels = self.processor.image_processor(images=images, return_tensors="pt")
        with torch.no_grad():
            logits = self.model(input_ids=full, attention_mask=torch.ones_like(full),
                                mm_token_type_ids=(full == self.model.config.image_token_id).int(), **pixels).logits
        reset_rope_deltas(self.model)
        n = len(prompt_ids)
        lp = torch.log_softmax(logits[0, n - 1:-1].float(), -1).gather(-1, full[0, n:, None])[:, 0]
        return TokenOutput(request_id, ids, lp.tolist(), "stop")


def test_tool_image_joins_the_trajectory_and_log_probs_match(worker, tmp_path):
    from omegaconf import OmegaConf

    from hybridflow.agents.tool_agent import ToolAgentLoop
    from hybridflow.config import config_to_dict
    from hybridflow.launch.config import load_config

    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.image_zoom_in_tool.ImageZoomInTool\n    config: {type: native}\n")
    base = worker.full_config
    cfg = load_config([f"actor_rollout_ref.model.path={base.actor_rollout_ref.model.path}",
                       f"critic.model.path={base.actor_rollout_ref.model.path}", "actor_rollout_ref.rollout.name=hf",
                       "data.max_response_length=200", f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                       "actor_rollout_ref.rollout.multi_turn.enable=true", "trainer.n_gpus_per_node=1",
                       "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
                       # the last turn may end by length, without the template's end-of-turn that 'strict' wants
                       "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                       "critic.ppo_micro_batch_size_per_gpu=2"])
    module, processor, tok = worker.actor_engine.module, worker.processor, worker.tokenizer
    engine = HFRolloutEngine(module, tok, processor=processor, seed=2)
    call = "<tool_call>" + json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [8, 4, 40, 36]}}) \
        + "</tool_call>"
    replica = _ScriptedFirstTurn(engine, module, processor, call)
    plain = OmegaConf.create(config_to_dict(cfg))
    loop = ToolAgentLoop(trainer_config=DictConfigWrap(plain, typed=cfg),
                         server_manager=AsyncLLMServerManager([replica], default_max_tokens=200), tokenizer=tok,
                         processor=processor, dataset_config=DictConfigWrap(plain.data, typed=cfg.data))
    image = Image.fromarray(np.random.default_rng(7).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    raw_prompt = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "zoom"}]}]
    out = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True, "max_tokens": 8}, request_id="t0",
                               raw_prompt=raw_prompt,
                               tools_kwargs={"image_zoom_in_tool": {"create_kwargs": {"image": image}}}))

    crop = out.multi_modal_data["image"][1]
    assert out.multi_modal_data["image"][0] is image and crop.size == (32, 32)
    assert np.array_equal(np.asarray(crop), np.asarray(image)[4:36, 8:40])  # bbox in original coordinates
    assert out.extra_fields["tool_call_count"] == 1 and out.extra_fields["tool_error_count"] == 0
    assert "tokenization_mismatch" not in out.extra_fields  # the full render expands the images alike
    # turn 2 was generated with both images: its prompt holds 12 (48x64) + 4 (32x32) image tokens
    prompt2, images2 = replica.calls[1]
    assert len(images2) == 2 and prompt2.count(module.config.image_token_id) == 16
    first = len(tok.encode(call, add_special_tokens=False)) + 1
    mask = out.response_mask
    obs_end = len(prompt2) - len(out.prompt_ids)
    assert mask[:first] == [1] * first and mask[first:obs_end] == [0] * (obs_end - first)
    assert mask[obs_end:] == [1] * (len(mask) - obs_end) and len(mask) > obs_end
    observation = out.response_ids[first:obs_end]
    assert observation.count(module.config.image_token_id) == 4
    assert "Zoomed in on the image to the region [8, 4, 40, 36]" in tok.decode(observation)

    batch = outputs_to_batch([out], len(out.prompt_ids), 200, tok.pad_token_id, processor)
    assert batch.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == [[1, 6, 8], [1, 4, 4]]
    keep = batch.batch["response_mask"].bool()
    actor = _actor_log_probs(worker, batch)
    torch.testing.assert_close(actor[keep], batch.batch["rollout_log_probs"][keep], rtol=0, atol=1e-5)


def test_a_failed_image_trajectory_keeps_its_images(worker, vision_data):
    """A trajectory whose agent loop raised becomes an untrained placeholder on the row's prompt; its image
    tokens must keep their pixels, or the batch's M-RoPE positions and the actor's forward would fail."""
    from types import SimpleNamespace

    from hybridflow.agents.loop_worker import AgentLoopWorker
    from hybridflow.data.rl_dataset import create_rl_dataset

    cfg = worker.full_config
    data = create_rl_dataset(str(vision_data / "train.parquet"), cfg.data, worker.tokenizer, processor=worker.processor)
    host = SimpleNamespace(processor=worker.processor, tokenizer=worker.tokenizer, config=cfg,
                           rollout_config=cfg.actor_rollout_ref.rollout)
    out = AgentLoopWorker._failed_output(host, dict(data[0]), "the loop raised")
    assert len(out.multi_modal_data["image"]) == 1 and out.response_mask == [0]
    batch = outputs_to_batch([out], P, R, worker.tokenizer.pad_token_id, worker.processor)
    assert batch.non_tensor_batch["multi_modal_inputs"][0]["image_grid_thw"].tolist() == [[1, 6, 6]]
    assert torch.isfinite(_actor_log_probs(worker, batch)).all()
