"""A ChatML chat template that renders tools, tool calls and tool responses in the hermes format.

Real checkpoints ship their own template (Qwen2.5's renders exactly this layout); tiny models built locally
(:mod:`hybridflow.utils.tiny_model`) need one to train and test tool use: the tool schemas go into the system
turn inside ``<tools></tools>``, an assistant's ``tool_calls`` become ``<tool_call>{"name": ..., "arguments":
...}</tool_call>`` blocks (what the ``hermes`` tool parser reads back), and consecutive ``tool`` messages are
grouped into one user turn of ``<tool_response>`` blocks. ``arguments`` may be a dict or a JSON string.
(Hugging Face renders templates with ``trim_blocks``: a newline right after a ``{% ... %}`` tag is dropped, so
those newlines are written as ``{{ '\\n' }}``.)
"""

HERMES_TOOL_CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
    " XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    "<|im_end|>\n"
    "{% elif messages and messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and loop.first %}"
    "{% elif m['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{% for tc in (m['tool_calls'] or []) %}"
    "{% set f = tc['function'] if tc['function'] is defined else tc %}"
    "{% if m['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ f['name'] }}\", \"arguments\": "
    "{{ f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) }}}\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

__all__ = ["HERMES_TOOL_CHAT_TEMPLATE"]
