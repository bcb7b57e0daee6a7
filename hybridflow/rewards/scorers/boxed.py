"""Extraction of the last ``\\boxed{...}`` (or ``\\fbox{...}``) of a LaTeX answer, braces balanced.

MATH (Hendrycks et al. 2021) reference solutions mark their final answer with ``\\boxed{}``; scorers and the
MATH preprocessor both need the content of the *last* one, with nested braces such as ``\\frac{1}{2}`` intact.
"""

from __future__ import annotations


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\boxed ...`` / ``\\fbox{...}`` substring including the command, or None."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    if text.startswith("\\boxed ", idx):  # "\boxed 5" form ends at the next "$" or whitespace
        rest = text[idx + len("\\boxed ") :]
        return "\\boxed " + rest.split("$")[0].split()[0] if rest.split() else None
    depth = 0
    for pos in range(idx, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : pos + 1]
    return None


def remove_boxed(boxed: str) -> str:
    """Content of a string returned by :func:`last_boxed_only_string`."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for prefix in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix) and boxed.endswith("}"):
            return boxed[len(prefix) : -1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def extract_boxed_answer(text: str) -> str | None:
    boxed = last_boxed_only_string(text)
    return remove_boxed(boxed) if boxed is not None else None
