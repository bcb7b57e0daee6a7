"""``python -m hybridflow ...`` is the same as the ``hybridflow`` console script."""

from hybridflow.cli import main
from hybridflow.utils.fast_exit import run_and_exit

run_and_exit(main)
