"""verl's interaction API (``verl.interactions``, as of its last release with it, April 2026) at
``hybridflow.interactions``: Gsm8kInteraction's instance lifecycle and the loader's exception types."""

from __future__ import annotations

import asyncio

import pytest

from hybridflow.interactions.base import BaseInteraction
from hybridflow.interactions.gsm8k_interaction import Gsm8kInteraction
from hybridflow.interactions.utils.interaction_registry import (
    get_interaction_class,
    initialize_interactions_from_config,
)


def test_start_without_ground_truth_stores_none():
    g = Gsm8kInteraction({"name": "gsm8k"})

    async def go():
        instance = await g.start_interaction("abc")
        done, reply, score, meta = await g.generate_response("abc", [{"role": "assistant", "content": "#### 18"}])
        return instance, done, reply, score, meta

    instance, done, reply, score, meta = asyncio.run(go())
    assert instance == "abc" and g._instance_dict["abc"]["ground_truth"] is None
    assert (done, score, meta) == (False, 0.0, {}) and reply.startswith("Your response is incorrect!")


def test_lifecycle_with_a_ground_truth_and_generated_ids():
    g = Gsm8kInteraction({"name": "gsm8k"})

    async def go():
        instance = await g.start_interaction(ground_truth="18")  # no id: a fresh one
        first = await g.generate_response(instance, [{"role": "assistant", "content": "#### 17"}])
        second = await g.generate_response(instance, [{"role": "user", "content": "q"},
                                                      {"role": "assistant", "content": "so #### 18"}])
        score = await g.calculate_score(instance)
        await g.finalize_interaction(instance)
        return instance, first, second, score

    instance, first, second, score = asyncio.run(go())
    assert isinstance(instance, str) and len(instance) > 8
    assert first[0] is False and first[2] == 0.0
    assert second == (True, "Your response is correct!", 1.0, {}) and score == 1.0
    assert instance not in g._instance_dict


def test_finalizing_an_unknown_instance_is_a_key_error():
    g = Gsm8kInteraction({"name": "gsm8k"})
    with pytest.raises(KeyError):
        asyncio.run(g.finalize_interaction("never-started"))

    async def twice():
        instance = await g.start_interaction("x", ground_truth="1")
        await g.finalize_interaction(instance)
        await g.finalize_interaction(instance)

    with pytest.raises(KeyError):
        asyncio.run(twice())


def test_get_interaction_class_reads_verl_paths_and_raises_verls_types():
    assert get_interaction_class("verl.interactions.gsm8k_interaction.Gsm8kInteraction") is Gsm8kInteraction
    assert get_interaction_class("hybridflow.interactions.base.BaseInteraction") is BaseInteraction
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        get_interaction_class("no_such_module.Interaction")
    with pytest.raises(AttributeError, match="Nope"):
        get_interaction_class("hybridflow.interactions.base.Nope")


def test_a_bad_class_name_in_the_yaml_is_a_module_not_found_error(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - name: x\n    class_name: my_missing_pkg.interactions.X\n    config: {}\n")
    with pytest.raises(ModuleNotFoundError, match="my_missing_pkg") as info:
        initialize_interactions_from_config(path)
    assert "interaction[0]" in str(info.value)  # our message names the entry
    path.write_text("interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                    "    config: {}\n")
    assert list(initialize_interactions_from_config(path)) == ["gsm8k"]  # verl's default name rule


def test_the_response_kept_is_the_last_assistant_content_as_given():
    """verl keeps the last assistant message's ``content`` as is (``None`` without one; "" without any assistant
    message) in ``_instance_dict``; such a response is scored as no answer."""
    g = Gsm8kInteraction({"name": "gsm8k"})

    async def go(messages):
        await g.start_interaction("i", ground_truth="42")
        done, _, score, _ = await g.generate_response("i", messages)
        response = g._instance_dict["i"]["response"]
        await g.finalize_interaction("i")
        return done, score, response

    assert asyncio.run(go([{"role": "assistant"}])) == (False, 0.0, None)
    assert asyncio.run(go([{"role": "user", "content": "hi"}])) == (False, 0.0, "")
    assert asyncio.run(go([{"role": "assistant", "content": "#### 41"}, {"role": "assistant", "content": "so #### 42"}
                           ])) == (True, 1.0, "so #### 42")
