"""The long-tail addition task's reward (``_common.long_tail_task``), in a file of its own with no imports.

It is loaded as ``custom_reward_function.path`` by hybridflow runs and called directly by TRL's reward
function in bench_vs_trl, so both frameworks score by one rule.  (A separate file because the custom reward
loader executes the file as a module before registering it in ``sys.modules``, which a module defining a
dataclass -- as ``_common`` does -- cannot survive.)
"""


def long_tail_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The answer is the first three characters; the filler after it is neither rewarded nor punished."""
    return float(solution_str.strip()[:3] == str(ground_truth))
