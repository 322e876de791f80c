"""A custom reward function run in its own process, with a time bound per call.

    scorer = RewardProcess("mylab.rewards:score", timeout_s=10.0)
    scorer.start()                      # ValueError: not offered, cannot import, no such function
    scorer.score([(response, answer), ...])   # [float | None, ...]; None = over the bound
    scorer.close()

Why a process of its own: the function is code a researcher wrote; the
trainer (and never the web server) runs it, and a call that hangs (a symbolic
simplifier on a pathological answer), exits or replaces the process cannot
take the run with it unnoticed. The child
(``python -m trainer.tasks.reward_child``) is a ``trainer.sandbox`` child: one
JSON line per call (the function's own prints go to the trainer's log), it dies
with the trainer, and a call over the bound ends it with everything it started;
the next call starts a fresh one. A call over the bound scores None (the caller
scores it 0 and counts it). A function that raises, returns no
number, or whose process ends mid-call is a ``RewardFunctionError``: the run
fails with that message, since retrying cannot fix it.

Which functions may run is ``trainer.reward_functions``' rule,
checked here before the child starts, and in the child (a module entry
offers only functions defined in that module).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.reward_functions import environment_entries, parse_reward_path, permit
from trainer.sandbox.child import BoundedChild, CallTimeout, ChildError

LOAD_TIMEOUT_S = 120.0  # importing the module (it may load its own libraries)


class RewardFunctionError(ValueError):
    """The reward function failed in a way a retry cannot fix (the message says how)."""


class RewardProcess:
    """The client side: start, score batches, close (see the module docstring)."""

    def __init__(self, path: str, timeout_s: float, load_timeout_s: float = LOAD_TIMEOUT_S):
        self.path = path
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.timeouts = 0  # calls over the bound, over this object's life
        self._child: BoundedChild | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        """Start the child and load the function; ValueError saying why it cannot run."""
        if self._child is None:
            entries = environment_entries()
            module_entry = False
            if entries is None:
                parse_reward_path(self.path)  # syntax only: the trainer run by hand
            else:
                module_entry = permit(self.path, entries).module_entry
            self._child = BoundedChild("trainer.tasks.reward_child", what=self.path)
            first = {"path": self.path, "defined_in_module": module_entry}
            try:
                self._child.start(first, self.load_timeout_s)
            except ChildError:
                self._child = None
                raise
        else:
            self._child.start()  # again after a call over the bound killed it

    def close(self) -> None:
        """End the child (and anything it started); safe to call twice."""
        if self._child is not None:
            self._child.close()

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """``fn(response, answer)`` for each pair, in order; None for a call over the bound."""
        self.start()
        assert self._child is not None
        out: list[float | None] = []
        for response, answer in pairs:
            try:
                reply = self._child.call({"response": response, "answer": answer}, self.timeout_s)
            except CallTimeout:
                self.timeouts += 1
                out.append(None)
                continue
            except ChildError as exc:
                raise RewardFunctionError(str(exc)) from None
            if "error" in reply:
                raise RewardFunctionError(f"{self.path}: {reply['error']}")
            out.append(float(reply["value"]))
        return out
