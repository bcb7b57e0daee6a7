"""``python -m hybridflow ...`` is the same as the ``hybridflow`` console script."""

import sys

from hybridflow.cli import main

sys.exit(main())
