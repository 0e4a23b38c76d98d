"""A load worker process (`python -m binlog_assets.load.worker`): one slot's job pickled
on stdin, its messages pickled on stdout; anything else it would print goes to stderr.
It dies with its parent: a run killed mid-load leaves no worker committing chunks
beside the run that resumes it."""

import ctypes
import os
import pickle
import signal
import sys

from binlog_assets.load.loader import serve_slot

_PR_SET_PDEATHSIG = 1

if __name__ == "__main__":
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the call
            sys.exit(1)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve_slot(pickle.load(sys.stdin.buffer), out)
