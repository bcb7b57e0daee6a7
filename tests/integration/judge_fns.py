"""Reward functions that ask a judge served on the rollout service (the two APIs a user writes against)."""

import json


async def ask_judge(data_source, solution_str, ground_truth, extra_info=None, judge=None, **kwargs):
    """hybridflow's client: ``await judge.chat(messages)``; the score is the share of digits in the judge's reply
    (any text scores, so a random tiny judge still gives varied rewards)."""
    reply = await judge.chat([{"role": "user", "content": f"{extra_info.get('question', '')} {solution_str}"}],
                             max_tokens=4, temperature=1.0)
    return {"score": sum(c.isdigit() for c in reply) / max(len(reply), 1), "judge_chars": len(reply)}


async def ask_router_like_verl(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                               reward_model_tokenizer):
    """verl's GenRM signature: an OpenAI chat request posted to the router address, the judge's tokenizer at hand."""
    import aiohttp

    request = {"messages": [{"role": "user", "content": solution_str}], "max_tokens": 4, "temperature": 0.0}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{reward_router_address}/v1/chat/completions", json=request) as resp:
            answer = json.loads(await resp.text())
    reply = answer["choices"][0]["message"]["content"]
    tokens = len(reward_model_tokenizer.encode(reply, add_special_tokens=False))
    return {"score": float(tokens) / 4.0, "usage_tokens": answer["usage"]["completion_tokens"]}


async def ask_and_parse(data_source, solution_str, ground_truth, extra_info=None, judge=None, **kwargs):
    """Parses a number out of the judge's reply: a reply without one is unparsable (counted, error_score)."""
    from hybridflow.rewards.judge import parse_score

    reply = await judge.chat([{"role": "user", "content": solution_str}], max_tokens=4, temperature=1.0)
    return parse_score(reply, scale=10.0)


def no_judge(data_source, solution_str, ground_truth, extra_info=None):
    """Takes none of the judge's keywords: a run with a judge refuses it at start."""
    return 0.0
