"""Loaded by every Python process the test session starts (this folder is on
their PYTHONPATH, tests/lab_isolation.py): records accesses to the lab's own
data (lab_access_audit.py), then runs the ``sitecustomize`` this one shadows,
if the interpreter has one.
"""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import lab_access_audit

    lab_access_audit.install()
finally:
    sys.path.remove(_here)


def _run_shadowed() -> None:
    for entry in sys.path:
        if os.path.abspath(entry or ".") == _here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed()
