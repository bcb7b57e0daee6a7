"""Interactions: verl's BaseInteraction API, the gsm8k interaction, the YAML loader and its errors."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from hybridflow.interactions import BaseInteraction, Gsm8kInteraction, initialize_interactions_from_config
from hybridflow.interactions.gsm8k_interaction import CORRECT, INCORRECT

VERL_YAML = """
interaction:
  - name: "gsm8k"
    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    config: {}
"""


def write(tmp_path, text, name="interaction.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_verl_gsm8k_config_and_conversation(tmp_path):
    interactions = initialize_interactions_from_config(write(tmp_path, VERL_YAML))
    assert list(interactions) == ["gsm8k"]
    gsm8k = interactions["gsm8k"]
    assert isinstance(gsm8k, Gsm8kInteraction) and gsm8k.name == "gsm8k" and gsm8k.config == {"name": "gsm8k"}

    async def go():
        iid = await gsm8k.start_interaction("req-1", ground_truth="72", query="q", name="gsm8k")
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "I think #### 70"}]
        wrong = await gsm8k.generate_response(iid, messages, name="gsm8k")
        messages += [{"role": "user", "content": wrong[1]}, {"role": "assistant", "content": "So #### 72"}]
        right = await gsm8k.generate_response(iid, messages)
        unformatted = await gsm8k.generate_response(iid, messages + [{"role": "assistant", "content": "72"}])
        score = await gsm8k.calculate_score(iid)
        await gsm8k.finalize_interaction(iid)
        return iid, wrong, right, unformatted, score

    iid, wrong, right, unformatted, score = asyncio.run(go())
    assert iid == "req-1"
    assert wrong == (False, INCORRECT, 0.0, {})
    assert right == (True, CORRECT, 1.0, {})
    assert unformatted[:3] == (False, INCORRECT, 0.0)  # strict: the "#### " marker is required, as in verl
    assert score == 0.0 and gsm8k._instance_dict == {}


def test_base_interaction_defaults():
    base = BaseInteraction({})
    assert base.name == "interaction_agent"

    async def go():
        iid = await base.start_interaction()
        return iid, await base.generate_response(iid, []), await base.calculate_score(), await base.finalize_interaction()

    iid, response, score, final = asyncio.run(go())
    assert isinstance(iid, str) and len(iid) > 8
    assert response == (False, "Your current result seems acceptable.", 0.8, {}) and score == 0.0 and final is None


def test_default_names_and_a_user_interaction_file(tmp_path, monkeypatch):
    (tmp_path / "my_interactions.py").write_text(textwrap.dedent('''
        from hybridflow.interactions.base import BaseInteraction

        class EchoInteraction(BaseInteraction):
            async def generate_response(self, instance_id, messages, **kwargs):
                return len(messages) > 2, "you said: " + messages[-1]["content"], 0.5, {"n": len(messages)}

        class Judge(BaseInteraction):
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        path = write(tmp_path, """
            interaction:
              - class_name: my_interactions.EchoInteraction
                config: {greeting: hi}
              - class_name: my_interactions.Judge
              - class_name: hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction
        """)
        interactions = initialize_interactions_from_config(path)
        assert list(interactions) == ["echo", "judge", "gsm8k"]
        echo = interactions["echo"]
        assert echo.config == {"greeting": "hi", "name": "echo"}
        out = asyncio.run(echo.generate_response("i", [{"role": "assistant", "content": "x"}]))
        assert out == (False, "you said: x", 0.5, {"n": 1})
    finally:
        sys.modules.pop("my_interactions", None)


@pytest.mark.parametrize("body, error, message", [
    ("interaction: {a: 1}", ValueError, "top-level 'interaction:' list"),
    ("interaction:\n  - name: x", ValueError, "needs 'class_name'"),
    ("interaction:\n  - class_name: Gsm8kInteraction", ValueError, "'package.module.Class' path"),
    ("interaction:\n  - class_name: no_such_pkg.mod.X", ModuleNotFoundError, "cannot import module 'no_such_pkg.mod'"),
    ("interaction:\n  - class_name: hybridflow.interactions.base.Nope", AttributeError, "has no attribute 'Nope'"),
    ("interaction:\n  - class_name: hybridflow.interactions.base.last_assistant_content", TypeError,
     "must be a subclass of hybridflow.interactions.base.BaseInteraction"),
    ("interaction:\n  - class_name: hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {x: 1}",
     ValueError, "takes no config keys, got ['x']"),
    ("interaction:\n  - class_name: hybridflow.interactions.base.BaseInteraction\n    nmae: y", ValueError,
     "unknown key(s) ['nmae']"),
    ("interaction:\n  - {name: a, class_name: hybridflow.interactions.base.BaseInteraction}\n"
     "  - {name: a, class_name: hybridflow.interactions.base.BaseInteraction}", ValueError, "Duplicate interaction name 'a' found"),
])
def test_bad_interaction_configs(tmp_path, body, error, message):
    with pytest.raises(error) as info:
        initialize_interactions_from_config(write(tmp_path, body))
    assert message in str(info.value)


def test_missing_file_and_missing_ground_truth(tmp_path):
    with pytest.raises(FileNotFoundError, match="interaction_config_path"):
        initialize_interactions_from_config(tmp_path / "nope.yaml")
    g = Gsm8kInteraction({"name": "g"})  # no ground truth: stored as None (verl), never judged correct

    async def go():
        instance = await g.start_interaction()
        return instance, await g.generate_response(instance, [{"role": "assistant", "content": "#### 72"}])

    instance, (done, _, score, _) = asyncio.run(go())
    assert g._instance_dict[instance]["ground_truth"] is None and (done, score) == (False, 0.0)
