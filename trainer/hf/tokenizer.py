"""The checkpoint's own tokenizer (``tokenizer.json``, read with the
``tokenizers`` library), behind the interface the tasks use
(``trainer.tasks.tokenizer.CharTokenizer``): ``pad_id``, ``bos_id``,
``eos_id``, ``vocab_size``, ``encode(text, bos, eos)``, ``decode(ids)``.

An imported model only makes sense on its own token ids, so a run whose
``model.source`` is a checkpoint encodes prompts and decodes responses with
it (``install_checkpoint_tokenizer``); a checkpoint without tokenizer.json is
a field error for RL runs.

With ``model.chat_template`` a prompt (``encode(..., bos=True)``, as the
tasks encode prompts) is first rendered as one user message through the
checkpoint's chat template with the generation prompt, the way transformers'
``apply_chat_template(..., add_generation_prompt=True)`` renders it (the
same sandboxed jinja2 environment, ``{% generation %}`` included, in a process of
its own with a time, output and memory bound: ``trainer.hf.chat_sandbox``), given
what transformers gives it: the named special tokens the tokenizer has,
``tools=None`` and ``documents=None``; the template writes its own BOS, so none is
added. Without a template a prompt is framed by tokenizer.json's own post-processor,
as transformers' ``tokenizer(prompt)`` frames it (transformers 5 ignores
``add_bos_token`` once tokenizer.json has one: tests/trainer/test_hf_chat_render.py).

Special tokens come from tokenizer_config.json (``bos_token``, ``eos_token``,
``pad_token``, ``unk_token``, ..., as strings or ``{"content": ...}``), overridden by
special_tokens_map.json as transformers reads them, then config.json's
``*_token_id``. A response ends at EOS or at any id of generation_config.json's
``eos_token_id`` (an int or a list: Llama 3.1 Instruct stops at <|eot_id|> and
<|eom_id|> too, Qwen3 at <|im_end|> and <|endoftext|>), as transformers'
``generate`` stops: ``stop_ids``. No BOS (Qwen has none) means prompts start with their first
token; no pad token means EOS pads (pads are never attended to).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.config import ExperimentConfig, ModelConfig
from trainer.errors import FieldError
from trainer.hf.chat_sandbox import ChatTemplateSandbox, TemplateRefused
from trainer.hf.families import SOURCE
from trainer.hf.files import read_json_file

RENDER_CACHE_SIZE = 100_000  # rendered conversations kept (a dataset's prompts, once each)
# What a checkpoint's chat template must render within its bounds to be registered.
PROBE_CONVERSATIONS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "What is 2 + 3?"),),
    (("system", "Answer with a number."), ("user", "2+2="), ("assistant", "4"), ("user", "3+5=")),
)


# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens a chat template sees.
SPECIAL_TOKEN_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def special_token_texts(folder: Path, tok_cfg: dict[str, Any]) -> dict[str, str]:
    """name -> text of the named special tokens the tokenizer has: tokenizer_config.json's
    ``{name}_token``, special_tokens_map.json's over them (transformers reads both so)."""
    merged = {**tok_cfg, **_read_json(folder / "special_tokens_map.json")}
    texts = {name: _token_text(merged.get(f"{name}_token")) for name in SPECIAL_TOKEN_NAMES}
    return {name: text for name, text in texts.items() if text is not None}


class CheckpointTokenizer:
    """A checkpoint's tokenizer.json with the task tokenizer's interface."""

    def __init__(
        self,
        folder: Path,
        chat_template: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ):
        from tokenizers import Tokenizer

        self.folder = folder
        try:
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises its own kinds for a bad file
            raise FieldError([(SOURCE, f"tokenizer.json does not load: {exc}")]) from None
        tok_cfg = _read_json(folder / "tokenizer_config.json")
        model_cfg = _read_json(folder / "config.json")
        self._special_text = special_token_texts(folder, tok_cfg)
        self._template = _sandboxed_template(folder, tok_cfg) if chat_template else None
        self.template_kwargs = dict(template_kwargs or {})
        self._rendered: dict[tuple[tuple[str, str], ...], str] = {}  # conversation -> text

        def special(name: str) -> int | None:
            text = self._special_text.get(name)
            if text is not None:
                token_id = self._tok.token_to_id(text)
                if token_id is None:
                    raise FieldError(
                        [(SOURCE, f"the tokenizer's {name}_token {text!r} is not a token")]
                    )
                return token_id
            value = model_cfg.get(f"{name}_token_id")
            return value[0] if isinstance(value, list) else value

        eos = special("eos")
        if eos is None:
            raise FieldError(
                [(SOURCE, "the checkpoint names no EOS token (tokenizer_config.json eos_token)")]
            )
        self.eos_id: int = eos
        self.bos_id: int | None = special("bos")
        pad = special("pad")
        self.pad_id: int = eos if pad is None else pad
        self.stop_ids: tuple[int, ...] = _stop_ids(
            eos, _read_json(folder / "generation_config.json")
        )
        too_large = [i for i in self.stop_ids if i >= self.vocab_size]
        if too_large:
            raise FieldError(
                [(SOURCE, f"generation_config.json eos_token_id {too_large[0]} is not a token id")]
            )

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def render_prompt(self, text: str) -> str:
        """``text`` as one user message in the chat template, generation prompt added."""
        return self.render_conversation((("user", text),))

    def render_conversation(self, messages: Iterable[tuple[str, str]]) -> str:
        """``(role, content)`` turns through the chat template, generation prompt
        added, with ``template_kwargs`` (model.chat_template_kwargs) as variables:
        what ``apply_chat_template(messages, add_generation_prompt=True, **kwargs)``
        renders."""
        if self._template is None:
            raise FieldError(
                [("model.chat_template", "a conversation needs the chat template turned on")]
            )
        turns = tuple((role, content) for role, content in messages)
        if turns in self._rendered:  # a run encodes each prompt again at every draw
            return self._rendered[turns]
        try:
            text = self._template.render(self._variables(turns))
        except TemplateRefused as exc:  # raise_exception(...), a bad turn, or a bound broken
            raise FieldError(
                [("model.chat_template", f"the chat template refused a prompt: {exc}")]
            ) from None
        if len(self._rendered) >= RENDER_CACHE_SIZE:
            self._rendered.clear()
        self._rendered[turns] = text
        return text

    def _variables(
        self, turns: tuple[tuple[str, str], ...], add_generation_prompt: bool = True
    ) -> dict[str, Any]:
        """What the template is given: what ``apply_chat_template(messages,
        add_generation_prompt=..., **chat_template_kwargs)`` passes it: the named
        special tokens the tokenizer has (an unset one stays undefined), the kwargs
        over them, the messages, ``tools`` and ``documents`` as None."""
        return {
            **{f"{name}_token": text for name, text in self._special_text.items()},
            **self.template_kwargs,
            "messages": [{"role": role, "content": content} for role, content in turns],
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }

    def probe_template(self) -> None:
        """Render the probe conversations (a question; a system prompt with a
        few-shot turn) within the sandbox's bounds, then end its process. A
        template that refuses one on purpose (``raise_exception``) passes; one
        that does not compile or breaks a bound is a FieldError naming the bound."""
        assert self._template is not None
        try:
            for turns in PROBE_CONVERSATIONS:
                try:
                    self._template.render(self._variables(turns))
                except TemplateRefused as exc:
                    if exc.kind != "refused":
                        raise FieldError(
                            [(SOURCE, f"its chat template is refused: {exc}")]
                        ) from None
        finally:
            self._template.close()

    def encode_conversation(self, messages: Iterable[tuple[str, str]]) -> list[int]:
        """Token ids of a conversation rendered by the template (it writes its own BOS)."""
        return self._tok.encode(self.render_conversation(messages), add_special_tokens=False).ids

    def encode_chat(
        self, messages: Iterable[tuple[str, str]], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant mask) of a conversation through the chat template, as
        ``apply_chat_template(..., tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True)`` gives them (TRL's assistant-only loss): 1
        on every token that overlaps a ``{% generation %}`` block's text, else 0; all
        0 for a template without the tag."""
        if self._template is None:
            raise FieldError(
                [("model.chat_template", "a conversation needs the chat template turned on")]
            )
        turns = tuple((role, content) for role, content in messages)
        try:
            text, spans = self._template.render_spans(self._variables(turns, add_generation_prompt))
        except TemplateRefused as exc:
            raise FieldError(
                [("model.chat_template", f"the chat template refused a conversation: {exc}")]
            ) from None
        encoding = self._tok.encode(text, add_special_tokens=False)
        return encoding.ids, assistant_mask(encoding.offsets, spans)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of ``text``, EOS appended on request. A prompt (``bos``) goes
        through the chat template when one is used, else it is framed by
        tokenizer.json's post-processor (its BOS, if it adds one), as
        ``tokenizer(prompt)`` is in transformers; other text gets no specials."""
        if bos and self._template is not None:
            ids = self._tok.encode(self.render_prompt(text), add_special_tokens=False).ids
        else:
            ids = self._tok.encode(text, add_special_tokens=bos).ids
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS, without pad/BOS. Ids past the
        tokenizer's vocabulary (checkpoints pad the embedding) decode to nothing."""
        kept = []
        skip = {self.pad_id, self.bos_id}
        stops = set(self.stop_ids)
        for raw in ids:
            token = int(raw)
            if token in stops:
                break
            if token in skip or token >= self.vocab_size:
                continue
            kept.append(token)
        return self._tok.decode(kept, skip_special_tokens=False)

    def close(self) -> None:
        """End the chat template's rendering process (a tokenizer used only to check)."""
        if self._template is not None:
            self._template.close()

    def __repr__(self) -> str:
        return f"CheckpointTokenizer({self.folder}, vocab_size={self.vocab_size})"


def assistant_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose character range (``offsets``) overlaps a span, in one pass
    over both (sorted) lists: transformers' ``return_assistant_tokens_mask`` rule."""
    mask = [0] * len(offsets)
    span = 0
    for index, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        if end > spans[span][0]:
            mask[index] = 1
    return mask


def _stop_ids(eos_id: int, generation_config: dict[str, Any]) -> tuple[int, ...]:
    """EOS, then generation_config.json's ``eos_token_id`` (an int or a list), once each."""
    named = generation_config.get("eos_token_id")
    listed = named if isinstance(named, list) else [named]
    extra = [i for i in listed if isinstance(i, int) and not isinstance(i, bool) and i >= 0]
    return tuple(dict.fromkeys([eos_id, *extra]))


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the checkpoint ({} when absent; FieldError when broken)."""
    if not path.exists():
        return {}
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise FieldError([(SOURCE, f"{path} must hold a JSON object")])
    return data


def template_source(folder: Path, tok_cfg: dict[str, Any] | None = None) -> str | None:
    """The checkpoint's chat template text: chat_template.jinja (transformers 5) or
    tokenizer_config.json's ``chat_template`` (a string, or named templates of
    which "default" is used); None when it has none."""
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text(errors="replace")
    raw = (tok_cfg if tok_cfg is not None else _read_json(folder / "tokenizer_config.json")).get(
        "chat_template"
    )
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("default")
    return raw if isinstance(raw, str) else None


def _sandboxed_template(folder: Path, tok_cfg: dict[str, Any]) -> ChatTemplateSandbox:
    """The chat template, compiled in its sandbox (``trainer.hf.chat_sandbox``)."""
    source = template_source(folder, tok_cfg)
    if source is None:
        raise FieldError(
            [("model.chat_template", f"{folder} has no chat template; turn chat_template off")]
        )
    try:
        return ChatTemplateSandbox(source)
    except TemplateRefused as exc:
        raise FieldError([("model.chat_template", f"the chat template: {exc}")]) from None


def checkpoint_tokenizer(cfg: ModelConfig) -> CheckpointTokenizer | None:
    """The tokenizer of ``cfg.source``; None for the builtin model."""
    if cfg.source == "builtin":
        return None
    folder = Path(cfg.source)
    if not (folder / "tokenizer.json").exists():
        raise FieldError(
            [
                (
                    SOURCE,
                    f"{folder} has no tokenizer.json; an RL run on an imported model encodes "
                    "its prompts with the checkpoint's own tokenizer",
                )
            ]
        )
    tokenizer = CheckpointTokenizer(
        folder, chat_template=cfg.chat_template, template_kwargs=cfg.chat_template_kwargs
    )
    if cfg.vocab_size is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise FieldError(
            [
                (
                    SOURCE,
                    f"tokenizer.json has {tokenizer.vocab_size} tokens but the model's "
                    f"embedding only {cfg.vocab_size}",
                )
            ]
        )
    return tokenizer


def install_checkpoint_tokenizer(task: Any, cfg: ExperimentConfig) -> None:
    """Make ``task`` speak the checkpoint's tokens (no-op for the builtin model),
    then check it in those tokens (``task_errors_in_tokens``): validation counted
    the lab's characters."""
    tokenizer = checkpoint_tokenizer(cfg.model)
    if tokenizer is None:
        task.tokens_known()  # the builtin model: the task's own tokens are the run's
        return
    task.tokenizer = tokenizer
    errors = task_errors_in_tokens(cfg, task)
    if errors:
        raise FieldError(errors)


def checkpoint_task_errors(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """What a run of ``cfg`` would be refused for when it starts on its checkpoint,
    found before it is queued (the platform's config gate, ``lab.configs``): the
    task built and spoken in the checkpoint's tokens (``task_errors_in_tokens``).
    Torch-free; [] for the builtin model."""
    if cfg.model.source == "builtin":
        return []
    from trainer.tasks.factory import make_task

    task = make_task(cfg.task)
    tokenizer = checkpoint_tokenizer(cfg.model)
    try:
        task.tokenizer = tokenizer
        return task_errors_in_tokens(cfg, task)
    finally:
        tokenizer.close()


ANSWER_SAMPLE = 16  # held-out problems whose perfect response must survive the tokenizer


def task_errors_in_tokens(cfg: ExperimentConfig, task: Any) -> list[tuple[str, str]]:
    """A task on a checkpoint's tokenizer: the lengths (prompt + ``rollout.max_new_tokens``
    within ``model.max_seq_len``, the longest supervised response with EOS within
    ``rollout.max_new_tokens``: ``trainer.tasks.factory.check_lengths``), then the
    answer format: a perfect response (the supervised target), encoded and decoded,
    must still score as correct, else no sampled response ever could (a tokenizer
    that cannot write ``####`` or the answer's digits)."""
    from trainer.tasks.factory import check_lengths

    errors = check_lengths(cfg, task)
    for problem in task.eval_set()[:ANSWER_SAMPLE]:
        written = task.tokenizer.decode(task.tokenizer.encode(problem.target, bos=False))
        if not task.is_correct(problem, written):
            errors.append(
                (
                    SOURCE,
                    f"the checkpoint's tokenizer cannot write this task's answers: the "
                    f"correct response {problem.target[-80:]!r} decodes as "
                    f"{written[-80:]!r}, which the verifier does not score as correct",
                )
            )
            break
    return errors
