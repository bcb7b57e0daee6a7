"""argparse for the commands, with a user error as one line and exit 2 (argparse's own error prints the usage
block first). ``--help`` is argparse's, listing every option."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from hybridflow.launch.command_line import EXIT_CONFIG_ERROR, config_error_text

__all__ = ["CommandParser", "one_line"]


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a multi-problem configuration error keeps one problem per line)."""
    if isinstance(getattr(exc, "messages", None), list):
        return config_error_text(exc)
    return " ".join(str(exc).split()) or type(exc).__name__


class CommandParser(argparse.ArgumentParser):
    """``hybridflow CMD: <what is wrong> (hybridflow CMD --help)`` on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR)
