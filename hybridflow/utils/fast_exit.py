"""Process entry points that exit in seconds, whatever the run left in memory.

At exit, CPython runs a last garbage collection over the whole heap; after a run that imported vLLM, held a
dataset and built engines, that alone took 4-10 s on this project's 2-core machine -- after an engine failure
had already been reported, or after Ctrl-C.  :func:`run_and_exit` calls the command and, when it fails or was
interrupted (an exception, or a non-zero exit code), freezes the heap first (``gc.freeze``: nothing alive now
is looked at again).  ``atexit`` handlers still run and objects are still released by reference counting;
only cycles alive at that moment are left for the operating system (some native libraries then report
"leaked" objects on stderr, after hybridflow's own message).  A successful command exits as usual.  Used only
by the real entry points (``hybridflow``, ``python -m hybridflow``, ``python -m
hybridflow.trainer.main_ppo``), never inside a process that goes on (a test calling ``main()``).
"""

from __future__ import annotations

import gc
import sys
from typing import Callable, NoReturn

__all__ = ["run_and_exit"]


def run_and_exit(main: Callable[[], int | None]) -> NoReturn:
    try:
        code = main()
    except BaseException:
        gc.freeze()
        raise
    if code:
        gc.freeze()
    sys.exit(code)
