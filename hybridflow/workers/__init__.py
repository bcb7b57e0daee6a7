"""Role workers (``Worker`` subclasses with ``@register`` methods): actor/rollout/ref, critic, reward model.

They are thin: model work goes to ``hybridflow.engine``, generation to ``hybridflow.rollout`` and the
loss maths to ``hybridflow.algorithms``.
"""
