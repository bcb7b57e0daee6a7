"""Multi-turn agent trajectories vs single-turn generation through the real agent-loop path: tokens/s ratio.

Both variants go through what training runs: ``AgentLoopManager.generate_sequences`` -> ``AgentLoopWorker``
-> ``AsyncLLMServerManager`` -> in-process ``RolloutServer`` -> ``hf`` engine (local backend), sampling at
temperature 1 with rollout log-probs, as a GRPO step does.

* **multi-turn**: N trajectories of a 3-turn agent loop (``ThreeTurnLoop`` below, registered like a user's
  loop): each turn generates ``T`` tokens, then a ``O``-token observation (a stand-in for a fast local tool's
  result) is appended and the next turn is sent as prompt + everything so far -- the shape of ``tool_agent``;
* **single-turn**: the same N prompts through ``single_turn_agent``, ``3 T`` tokens each in one call: the
  same number of generated tokens.

``ratio`` = multi-turn generated tokens/s over single-turn, with ``rollout.enable_prefix_caching`` on (the
default: turn k+1 prefills only the observation) and off (turn k+1 prefills its whole history again).
Variants alternate over ``--rounds`` rounds; the best wall and CPU time of each is reported.

    python benchmarks/bench_agent_loop.py            # qwen2 "medium" (20M), 32 trajectories x 3 x 32 tokens
    python benchmarks/bench_agent_loop.py --quick    # the same, 2 rounds
    python benchmarks/bench_agent_loop.py --smoke    # the tiny model, seconds (a test runs it)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import DEFAULT_WORKDIR, base_model, print_state, print_table  # noqa: E402

from hybridflow.agents.base import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register  # noqa: E402

LOOP = "bench_three_turn"


@register(LOOP)
class ThreeTurnLoop(AgentLoopBase):
    """``turns`` model turns of ``turn_tokens`` each with the row's ``observation`` ids appended between
    them (masked out, log-prob 0), every turn one ``server_manager.generate`` call on the whole history."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        prompt = [int(t) for t in kwargs["raw_prompt_ids"]]
        observation = [int(t) for t in kwargs["observation"]]
        turns, tokens = int(kwargs["turns"]), int(kwargs["turn_tokens"])
        response, mask, log_probs = [], [], []
        generate_s = 0.0
        for turn in range(turns):
            if turn:
                response += observation
                mask += [0] * len(observation)
                log_probs += [0.0] * len(observation)
            start = time.perf_counter()
            out = await self.server_manager.generate(request_id=kwargs["request_id"], prompt_ids=prompt + response,
                                                     sampling_params=dict(sampling_params, max_tokens=tokens))
            generate_s += time.perf_counter() - start
            response += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += list(out.log_probs or [0.0] * len(out.token_ids))
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask,
                               response_logprobs=log_probs if sampling_params.get("logprobs") else None,
                               num_turns=2 * turns, metrics=AgentLoopMetrics(generate_sequences=generate_s))


def build_config(model: str, prompt_len: int, response_len: int, n: int, caching: bool, agent: str):
    from hybridflow.launch.config import load_config

    a = "actor_rollout_ref"
    return load_config([
        f"{a}.model.path={model}", f"critic.model.path={model}", f"{a}.rollout.name=hf",
        f"data.max_prompt_length={prompt_len}", f"data.max_response_length={response_len}",
        f"data.train_batch_size={n}", f"{a}.actor.ppo_mini_batch_size={n}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu={n}", "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=1", f"{a}.rollout.n=1", f"{a}.rollout.temperature=1.0",
        f"{a}.rollout.calculate_log_probs=true", f"{a}.rollout.ignore_eos=true",
        f"{a}.rollout.enable_prefix_caching={str(caching).lower()}", f"{a}.rollout.max_num_seqs={max(n, 8)}",
        f"{a}.rollout.agent.num_workers=1", f"{a}.rollout.agent.default_agent_loop={agent}",
        "reward_model.use_reward_loop=false",  # generation only: the rows carry no reward_model
    ])


def prompt_batch(prompts: list[list[int]], observations: list[list[int]], turns: int, turn_tokens: int):
    from hybridflow.protocol import DataProto

    def column(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    n = len(prompts)
    return DataProto.from_dict(non_tensors={
        "raw_prompt_ids": column(prompts), "observation": column(observations),
        "turns": column([turns] * n), "turn_tokens": column([turn_tokens] * n),
        "data_source": column(["bench"] * n)}, meta_info={"global_steps": 1})


def run_variant(model, tok, model_dir: str, prompts, observations, turns: int, tokens: int, multi: bool,
                caching: bool) -> dict[str, Any]:
    """One ``generate_sequences`` call of the variant on a fresh engine; times and engine counters."""
    from hybridflow.agents import AgentLoopManager
    from hybridflow.rollout import create_rollout_engine
    from hybridflow.rollout.service.fleet import ServerFleet
    from hybridflow.rollout.service.server import RolloutServer
    from hybridflow.workers.rollout_server_worker import hf_engine_kwargs

    n, obs = len(prompts), len(observations[0])
    response_len = turns * tokens + (turns - 1) * obs if multi else turns * tokens
    cfg = build_config(model_dir, max(len(p) for p in prompts), response_len, n, caching,
                       LOOP if multi else "single_turn_agent")
    settings = hf_engine_kwargs(cfg.actor_rollout_ref.rollout, seed=0)  # rollout.enable_prefix_caching among them
    engine = create_rollout_engine("hf", model=model, tokenizer=tok, **settings)
    fleet = ServerFleet([RolloutServer(engine, name="bench")])
    try:
        manager = AgentLoopManager(cfg, fleet, "local", tok)
        batch = prompt_batch(prompts, observations, turns, tokens)
        start, cpu = time.perf_counter(), time.process_time()
        out = manager.generate_sequences(batch)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        stats = engine.stats()
    finally:
        fleet.shutdown()
    generated = int(out.batch["response_mask"].sum())
    assert generated == n * turns * tokens, (generated, n * turns * tokens)
    return {"wall": wall, "cpu": cpu, "generated": generated, "prefill": stats["prefill_tokens"],
            "reused": stats["prefix_reused_tokens"], "prefill_forwards": stats["prefill_forwards"],
            "decode_steps": stats["decode_steps"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 4 trajectories, short turns, 1 round")
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    ap.add_argument("--size", default=None, help="tiny_model size (default medium; smoke: tiny)")
    ap.add_argument("--trajectories", type=int, default=None, help="concurrent trajectories (default 32; smoke 4)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=None, help="first prompt tokens (default 128; smoke 16)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="generated tokens per turn (default 32; smoke 4)")
    ap.add_argument("--observation", type=int, default=None, help="observation tokens (default 16; smoke 4)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; quick 2; smoke 1)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    smoke = args.smoke
    size = args.size or ("tiny" if smoke else "medium")
    n = args.trajectories or (4 if smoke else 32)
    prompt_len = args.prompt_len or (16 if smoke else 128)
    tokens = args.turn_tokens or (4 if smoke else 32)
    obs_len = args.observation or (4 if smoke else 16)
    rounds = args.rounds or (1 if smoke else 2 if args.quick else 3)
    model_dir = base_model(DEFAULT_WORKDIR, size)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    first = len(tok.all_special_ids)
    prompts = [torch.randint(first, len(tok), (prompt_len,), generator=gen).tolist() for _ in range(n)]
    observations = [torch.randint(first, len(tok), (obs_len,), generator=gen).tolist() for _ in range(n)]
    state = print_state("bench_agent_loop")
    print(f"model: qwen2 {size}; {n} concurrent trajectories, {args.turns} turns x {tokens} generated tokens with "
          f"{obs_len}-token observations between turns vs {args.turns * tokens} tokens in one turn; first prompt "
          f"{prompt_len} tokens; {args.threads} thread(s); {rounds} round(s); local backend, hf engine")
    variants = [(True, True), (False, True), (True, False), (False, False)]  # (multi-turn, prefix caching)
    best: dict[tuple[bool, bool], dict[str, Any]] = {}
    for _ in range(rounds):  # alternate, so machine noise hits every variant alike
        for multi, caching in variants:
            r = run_variant(model, tok, model_dir, prompts, observations, args.turns, tokens, multi, caching)
            b = best.setdefault((multi, caching), r)
            b["wall"], b["cpu"] = min(b["wall"], r["wall"]), min(b["cpu"], r["cpu"])
    rows = []
    for multi, caching in variants:
        r = best[(multi, caching)]
        rows.append([f"{args.turns}-turn agent loop" if multi else "single turn", "on" if caching else "off",
                     r["generated"], r["prefill"], r["reused"], r["prefill_forwards"], r["decode_steps"], r["wall"],
                     r["cpu"], r["generated"] / r["wall"], r["generated"] / r["cpu"]])
    print_table(["variant", "prefix caching", "generated tokens", "prefill computed", "prefill reused",
                 "prefill forwards", "decode steps", "wall s", "CPU s", "tokens/s (wall)", "tokens/s (CPU)"], rows)

    def ratio(caching: bool, key: str) -> float:
        return best[(False, caching)][key] / best[(True, caching)][key]  # time single / time multi = tok/s ratio

    print(f"load_after={' '.join(f'{x:.2f}' for x in os.getloadavg())} load_before={state['load']}")
    print(f"cpu_ratio_no_prefix={ratio(False, 'cpu'):.3f}")
    print(f"ratio_no_prefix={ratio(False, 'wall'):.3f}")
    print(f"cpu_ratio={ratio(True, 'cpu'):.3f}")
    print(f"ratio={ratio(True, 'wall'):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
