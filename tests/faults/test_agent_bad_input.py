"""Bad agent-loop input through ``hybridflow train``: configuration errors stop the run before any model loads
(exit 2, the key and the fix).  Rows naming an unregistered agent loop and failing loops: ``test_silent_runs.py``."""

from __future__ import annotations

import pytest

from .conftest import A, base_args, invoke_cli, read_metrics


def _yaml(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_TOOLS = "tools:\n  - class_name: no_such_pkg.tools.Missing\n"
BAD_LOOPS = "- name: mine\n  _target_: nowhere_module.MyLoop\n"

CONFIG_CASES = [
    ("tool_class_does_not_import",
     lambda t: [f"{A}.rollout.multi_turn.tool_config_path={_yaml(t, 'tools.yaml', BAD_TOOLS)}"],
     ["multi_turn.tool_config_path", "no_such_pkg", "cannot import"]),
    ("tool_config_missing", lambda t: [f"{A}.rollout.multi_turn.tool_config_path={t / 'nope.yaml'}"],
     ["multi_turn.tool_config_path", "nope.yaml", "does not exist"]),
    ("agent_loop_target_missing",
     lambda t: [f"{A}.rollout.agent.agent_loop_config_path={_yaml(t, 'loops.yaml', BAD_LOOPS)}"],
     ["agent.agent_loop_config_path", "nowhere_module"]),
    ("default_agent_not_registered", lambda t: [f"{A}.rollout.agent.default_agent_loop=my_loop"],
     ["default_agent_loop='my_loop'", "single_turn_agent", "agent_loop_config_path"]),
    ("unknown_tool_call_format", lambda t: [f"{A}.rollout.multi_turn.format=xml"],
     ["multi_turn.format='xml'", "hermes"]),
    ("interaction_file_missing", lambda t: [f"{A}.rollout.multi_turn.interaction_config_path={t / 'x.yaml'}"],
     ["interaction_config_path", "x.yaml"]),
    ("retired_sglang_option", lambda t: [f"{A}.rollout.multi_turn.num_repeat_rollouts=2"],
     ["num_repeat_rollouts", "rollout.n"]),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_agent_config_errors_stop_the_run_before_models_load(case, fault_data, nano_model_dir, tmp_path):
    _, extra, needles = case
    result = invoke_cli(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, extra=extra(tmp_path)),
                        tmp_path)
    assert result.escaped is None, result.message
    assert result.rc == 2
    message = result.stderr.lower()
    for needle in needles:
        assert needle.lower() in message, (needle, result.stderr)
    assert not read_metrics(tmp_path)  # nothing trained
