"""The jinja2 environment a chat template renders in: transformers' own
(``transformers.utils.chat_template_utils._cached_compile_jinja_template``), a
jinja2 ``ImmutableSandboxedEnvironment`` (no attribute access to Python
internals, no mutation of the conversation).

Only the rendering process imports it (``trainer.hf.chat_child``): the sandbox
stops what a template can reach, the process bounds what it can cost (time,
output, memory; ``trainer.hf.chat_sandbox``). A construct transformers adds
(a tag, a filter, a global) belongs here, so that the lab renders what
``apply_chat_template`` renders.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar


def _generation_tracker():
    """transformers' ``AssistantTracker``: the ``{% generation %}...{% endgeneration %}``
    block (TRL's training templates mark the assistant's text with it) renders its
    body, and while a tracker is active records the body's (start, end) character
    span in the rendered text, from which ``return_assistant_tokens_mask`` (and the
    lab's ``CheckpointTokenizer.encode_chat``) marks the assistant's tokens."""
    import jinja2
    from jinja2.ext import Extension

    class GenerationTracker(Extension):
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._tracking = ContextVar("generation_tracker", default=None)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller) -> str:
            body = caller()
            tracking = self._tracking.get()
            if tracking is not None:
                rendered, spans = tracking  # the chunks yielded so far precede this block
                start = sum(len(chunk) for chunk in rendered)
                spans.append((start, start + len(body)))
            return body

        @contextmanager
        def activate_tracker(self, rendered: list[str], spans: list[tuple[int, int]]):
            token = self._tracking.set((rendered, spans))
            try:
                yield
            finally:
                self._tracking.reset(token)

    return GenerationTracker


def chat_template_environment():
    """The sandboxed jinja2 environment transformers renders chat templates in
    (``transformers.utils.chat_template_utils._cached_compile_jinja_template``):
    trim_blocks, lstrip_blocks and loop controls; ``tojson`` without HTML
    escaping (json.dumps, ensure_ascii=False); ``raise_exception``;
    ``strftime_now`` (the current local time, as Llama 3.1's template dates its
    system prompt); ``dict`` and an underscore-refusing ``namespace``; the
    ``{% generation %}`` tag (``env.activate_tracker(rendered, spans)``)."""
    import json as _json
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return _json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes ({name!r})"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_generation_tracker(), jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
