"""A user's agent loop that fails for every fourth prompt (a tool that always crashes on it): verl's failed groups.

Written against verl's API; loaded by name from ``v1_loops.yaml``.  The failure is a property of the prompt, so
a failed group fails again whenever it is generated, and a refill (a fresh prompt) can succeed.
"""

from typing import Any

from hybridflow.experimental.agent_loop import AgentLoopBase, AgentLoopOutput


class FlakyAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        if int(kwargs.get("index", 0)) % 4 == 1:
            raise RuntimeError(f"the tool crashed on prompt {kwargs.get('index')}")
        prompt_ids = [int(t) for t in kwargs["raw_prompt_ids"]]
        out = await self.server_manager.generate(request_id=kwargs["request_id"], prompt_ids=prompt_ids,
                                                 sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=list(out.token_ids),
                               response_mask=[1] * len(out.token_ids),
                               response_logprobs=list(out.log_probs) if out.log_probs is not None else None,
                               num_turns=2)
