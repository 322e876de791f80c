"""The process a chat template renders in (``trainer.hf.chat_sandbox``'s child).

    python -m trainer.hf.chat_child --fd N --parent PID --memory-mb 1024

First message ``{"source": TEMPLATE}``: compiled in ``chat_environment``'s
sandbox, answered ``{"ready": true}`` or ``{"error", "kind"}``. Then each request
``{"variables": {...}, "max_chars": N}`` is answered ``{"text": ..., "spans": [[start,
end], ...]}`` (the ``{% generation %}`` blocks' character spans) or
``{"error", "kind"}``: ``refused`` (the template's own ``raise_exception`` or a
template error), ``unsafe`` (it reached for what the sandbox forbids, e.g.
``__class__``), ``too_long`` (more than ``max_chars`` characters: rendering
stops there), ``recursion``, ``memory`` (the address-space cap), ``failed``
(any other exception). The time bound is the parent's: it kills this process.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainer.sandbox.serve import child_arguments, serve


def _failure(exc: BaseException) -> dict[str, str]:
    from jinja2 import TemplateError
    from jinja2.exceptions import SecurityError

    if isinstance(exc, SecurityError):  # reached for what the sandbox forbids
        return {"kind": "unsafe", "error": str(exc)[:2000]}
    if isinstance(exc, RecursionError):
        return {"kind": "recursion", "error": "it recursed too deeply (a macro calling itself?)"}
    if isinstance(exc, MemoryError):
        return {"kind": "memory", "error": "it needed more memory than a render may take"}
    if isinstance(exc, TemplateError):
        return {"kind": "refused", "error": str(exc)[:2000]}
    return {"kind": "failed", "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}


class _Renderer:
    template: Any
    environment: Any

    def compile(self, first: dict[str, Any]) -> dict[str, Any]:
        from trainer.hf.chat_environment import chat_template_environment

        try:
            self.environment = chat_template_environment()
            self.template = self.environment.from_string(str(first["source"]))
        except Exception as exc:  # a syntax error, or a parse that recursed or ran out of memory
            return _failure(exc)
        return {"ready": True}

    def render(self, request: dict[str, Any]) -> dict[str, Any]:
        limit = int(request["max_chars"])
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        size = 0
        try:
            with self.environment.activate_tracker(parts, spans):
                for chunk in self.template.generate(**request["variables"]):
                    size += len(chunk)
                    if size > limit:
                        return {
                            "kind": "too_long",
                            "error": f"it rendered more than {limit} characters",
                        }
                    parts.append(chunk)
        except Exception as exc:
            return _failure(exc)
        return {"text": "".join(parts), "spans": spans}


def main(argv: list[str] | None = None) -> None:
    args = child_arguments(argparse.ArgumentParser(prog="python -m trainer.hf.chat_child"), argv)
    renderer = _Renderer()
    serve(args.fd, renderer.compile, renderer.render)


if __name__ == "__main__":
    main()
