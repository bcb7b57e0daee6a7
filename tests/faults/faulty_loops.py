"""Agent loops that misbehave the ways a user's loop can (registered by ``faulty_loops.yaml``, beside this file)."""

from typing import Any

from hybridflow.agents.single_turn import SingleTurnAgentLoop


class RaisesAlways(SingleTurnAgentLoop):
    """A bug on every trajectory."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        raise RuntimeError("agent loop bug: lost the conversation state")


class RaisesOnSomePrompts(SingleTurnAgentLoop):
    """A bug on the prompts whose dataset index is a multiple of 4 (a quarter of the addition task's rows)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        if int(kwargs["index"]) % 4 == 0:
            raise RuntimeError(f"agent loop bug on prompt {kwargs['index']}")
        return await super().run(sampling_params, **kwargs)


class MasksEverything(SingleTurnAgentLoop):
    """Generates normally but marks no token as the model's (a loop that forgot to set response_mask)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        out = await super().run(sampling_params, **kwargs)
        out.response_mask = [0] * len(out.response_mask)
        return out
