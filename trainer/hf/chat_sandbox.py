"""A checkpoint's chat template rendered in a sandbox with bounds.

    sandbox = ChatTemplateSandbox(source)          # TemplateRefused: does not compile
    sandbox.render({"messages": [...], "add_generation_prompt": True, ...})  # -> str
    sandbox.close()

A chat template is code from a checkpoint folder. It renders in jinja2's
immutable sandbox (``trainer.hf.chat_environment``: what it can reach), inside
a process of its own (``trainer.hf.chat_child``, a ``trainer.sandbox`` child:
what it can cost), with ``RenderLimits``: a time bound per render (over it the
process is killed and restarted), an output bound (rendering stops at
``max_chars``), an address-space cap, and a bound on the template's own size.
A template that recurses, loops for minutes, or writes gigabytes is a
``TemplateRefused`` saying which bound it broke; callers turn it into a field
error (``model.chat_template`` in a run, ``path`` at registration).

Both the trainer (every prompt of a run) and the web process (a probe at
registration, ``trainer.hf.validate``) render here. What the template is given
(the variables dict: ``messages``, ``add_generation_prompt``, the special
tokens, a run's ``chat_template_kwargs``) is the caller's
(``trainer.hf.tokenizer.CheckpointTokenizer``); what it may use is the
environment's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.sandbox.child import BoundedChild, CallTimeout, ChildError


@dataclass(frozen=True)
class RenderLimits:
    time_s: float = 5.0  # one render; a real template takes well under a millisecond
    # One render's text: the longest prompt (task.max_prompt_chars <= 1M) twice over.
    max_chars: int = 2_000_000
    memory_mb: int = 1024  # the rendering process's address space
    max_source_chars: int = 1_000_000  # the template itself (real ones: 1-20 KB)
    start_s: float = 15.0  # start the process and compile the template (constants fold here)


class TemplateRefused(ValueError):
    """The template does not compile, refused a conversation, or broke a bound."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = (
            kind  # refused | unsafe | too_long | recursion | memory | failed | timeout | syntax
        )


class ChatTemplateSandbox:
    def __init__(self, source: str, limits: RenderLimits | None = None):
        self.limits = limits or RenderLimits()
        if len(source) > self.limits.max_source_chars:
            raise TemplateRefused(
                f"the template is {len(source)} characters; at most "
                f"{self.limits.max_source_chars} are rendered",
                "too_long",
            )
        self._child = BoundedChild(
            "trainer.hf.chat_child",
            ["--memory-mb", str(self.limits.memory_mb)],
            what="the chat template",
            max_answer_bytes=8 * self.limits.max_chars + 4096,  # JSON escapes cost up to 6x
        )
        try:
            self._child.start({"source": source}, self.limits.start_s)
        except ChildError as exc:
            raise TemplateRefused(f"it does not compile: {exc}", "syntax") from None

    def render(self, variables: dict[str, Any]) -> str:
        """The template's text for ``variables``; TemplateRefused naming the bound."""
        return self.render_spans(variables)[0]

    def render_spans(self, variables: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
        """The template's text and the character spans of its ``{% generation %}``
        blocks (the assistant's text in TRL's training templates)."""
        request = {"variables": variables, "max_chars": self.limits.max_chars}
        try:
            answer = self._child.call(request, self.limits.time_s)
        except CallTimeout:
            raise TemplateRefused(
                f"it took longer than {self.limits.time_s:g} s to render one conversation",
                "timeout",
            ) from None
        except ChildError as exc:
            raise TemplateRefused(str(exc), "failed") from None
        if "error" in answer:
            raise TemplateRefused(str(answer["error"]), str(answer.get("kind", "failed")))
        spans = [(int(start), int(end)) for start, end in answer.get("spans", [])]
        return str(answer["text"]), spans

    def close(self) -> None:
        self._child.close()
