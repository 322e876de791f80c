"""The rollout engine: a separate inference implementation of the policy.

Like vLLM next to Megatron, it has its own weight layout (fused gate|up
expert weights), its own forward with a preallocated static KV cache, and its
own precision (``trainer.rollout.numerics``). Every RL step it receives the
training model's ``state_dict()`` (``load_weights``), samples responses, and
records each token's log-prob and each MoE layer's natural top-k experts.

It shares with the training model only the definitions of the formulas
(positions, rotary angles, the attention mask, the grouped-matmul kernel);
the numerics differ, which is the training-inference mismatch under study.

    engine = RolloutEngine(cfg.model, vocab_size, precision="bf16", device=dev)
    engine.load_weights(model.state_dict())
    batch = engine.generate(prompt_tokens, prompt_mask, max_new_tokens=16, ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.config import ModelConfig
from trainer.model.expert_parallel import all_finished
from trainer.model.layers import positions_from_mask
from trainer.rollout.forward import EngineForward
from trainer.rollout.numerics import Numerics
from trainer.rollout.router_noise import RouterNoise
from trainer.rollout.routing_pack import PackedRouting, index_dtype
from trainer.rollout.sampling import (
    replay_draws,
    sample_next,
    sampling_stream,
    scaled_logprobs,
)
from trainer.rollout.static_decode import (
    bucket_for,
    compiled_decode,
    compiled_moe_backend,
    decode_buckets,
    zero_cache,
)
from trainer.rollout.weights import EngineLayer, EngineWeights


@dataclass
class RolloutBatch:
    """Sampled sequences in the shared batch layout (docs/trainer-internals.md).

    tokens, attention_mask, response_mask: (B, T); logprobs: (B, T) fp32, the
    engine's log-prob of every prompt and response token (0 at the first real
    token and on pads); routing: natural top-k per MoE layer, or None for a
    dense model; prompt_len: P, the padded prompt width.
    """

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    routing: PackedRouting | None
    prompt_len: int

    @property
    def routing_mask(self) -> torch.Tensor | None:
        return None if self.routing is None else self.routing.routing_mask


class RolloutEngine:
    """The engine, composed of its parts: its weights (``weights``:
    ``EngineWeights``, filled by ``load_weights``), its forward with a static KV
    cache (``forward_pass``: ``EngineForward``), and here scoring and sampling."""

    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        precision: str = "bf16",
        device: torch.device | str = "cpu",
        moe_backend: str = "auto",
        router_noise: RouterNoise | None = None,
        stop_check_every: int = 8,
        fp8_gemm: str = "auto",
        decode: str = "eager",
        sampler: str = "inverse_cdf",
    ):
        if stop_check_every < 1:
            raise ValueError(f"stop_check_every must be >= 1, not {stop_check_every}")
        self.cfg = cfg
        # The routing-only dose (trainer.rollout.router_noise): None or sigma 0 = off.
        self.router_noise = router_noise if router_noise and router_noise.active else None
        self.vocab_size = vocab_size
        # fp8_gemm: which fp8 GEMMs run real e4m3 kernels; "auto" decides by the
        # device's capability (trainer.rollout.fp8), the others are for tests and benches.
        self.num = Numerics(precision, device, fp8_gemm)
        self.device = self.num.device
        if decode not in ("eager", "compiled"):
            raise ValueError(f"decode must be 'eager' or 'compiled', not {decode!r}")
        # rollout.decode: "compiled" decodes with the fixed-shape step under
        # torch.compile (trainer.rollout.static_decode), built at the first rollout.
        self.decode = decode
        # rollout.sampler: inverse_cdf or the exponential race (trainer.rollout.sampling)
        self.sampler = sampler
        self._compiled_step = None
        if decode == "compiled":
            moe_backend = compiled_moe_backend(moe_backend, self.num.dtype)
        # Decode steps between two checks whether every row stopped: the check
        # reads a flag on the host (a sync); between checks the loop runs on
        # without waiting (``_sample``).
        self.stop_check_every = stop_check_every
        self.weights = EngineWeights(cfg, self.num)
        self.forward_pass = EngineForward(cfg, self.weights, moe_backend, self.router_noise)
        self._kept_routing: torch.Tensor | None = None  # the compiled step's (_routing_buffer)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Take the training model's ``state_dict()`` (``EngineWeights.load``)."""
        self.weights.load(state_dict)

    @property
    def layers(self) -> list[EngineLayer]:
        return self.weights.layers

    @property
    def loaded(self) -> bool:
        return self.weights.loaded

    @property
    def expert_shard(self):
        """Expert parallelism (trainer.model.expert_parallel): this rank holds the
        experts of ``expert_shard`` only; load_weights then takes those slices and
        every MoE layer sends its rows to their experts' rank and back."""
        return self.weights.expert_shard

    @expert_shard.setter
    def expert_shard(self, shard) -> None:
        self.weights.expert_shard = shard

    @property
    def moe_backend(self) -> str:
        return self.forward_pass.moe.backend

    @property
    def precision(self) -> str:
        return self.num.precision

    @property
    def fp8_mode(self) -> str | None:
        """Which fp8 GEMMs are native (``trainer.rollout.fp8.Fp8Plan.label``); None unless fp8."""
        plan = self.num.fp8_plan
        return None if plan is None else plan.label(moe=bool(self.cfg.n_experts))

    @property
    def n_moe_layers(self) -> int:
        return self.cfg.n_moe_blocks

    # ------------------------------------------------------------------ scoring
    def score(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, PackedRouting | None]:
        """Teacher-forced log-probs (B, T) and natural routing of given tokens
        (one prefill over all positions; same conventions as ``generate``)."""
        self._check_loaded()
        with torch.inference_mode():
            tokens = tokens.to(self.device)
            mask = attention_mask.to(self.device).bool()
            b, t = tokens.shape
            routing = self._routing_buffer(b, t)
            logits = self.forward_pass.forward(
                tokens, positions_from_mask(mask), mask, None, routing, True
            )
            logprobs = prompt_logprobs(logits, tokens, mask, temperature)
        # Clones outside inference mode: callers may use them under autograd.
        packed = None
        if routing is not None:
            packed = PackedRouting(routing.clone(), self.cfg.n_experts, mask.clone())
        return logprobs.clone(), packed

    # ------------------------------------------------------------------ sampling
    def generate(
        self,
        prompt_tokens: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        eos_id: int | Sequence[int] | None = None,
        pad_id: int = 0,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
        score_prompt: bool = True,
    ) -> RolloutBatch:
        """Sample up to ``max_new_tokens`` per row after left-padded prompts.

        prompt_tokens, prompt_mask: (B, P). A row stops at ``eos_id`` (EOS
        kept, later columns padded); the loop ends when every row stopped.
        ``eos_id`` is one id or several (generation_config.json's
        ``eos_token_id`` list, as transformers' ``generate`` takes it): any ends a row.
        ``temperature`` 0 decodes greedily. ``use_kv_cache=False`` recomputes
        the full prefix every step (for the benchmark). ``score_prompt=False``:
        the prompt's log-probs are left 0 and the prefill applies the LM head at
        the last prompt position only (an RL step reads response log-probs only;
        the sampled tokens are the same).
        """
        self._check_loaded()
        p = prompt_tokens.shape[1]
        total = p + max_new_tokens
        if total > self.cfg.max_seq_len and self.weights.pos_emb is not None:
            raise ValueError(f"prompt + max_new_tokens ({total}) exceeds max_seq_len")
        stop_ids = None
        if eos_id is not None:
            ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
            stop_ids = torch.tensor(ids, dtype=torch.long, device=self.device) if ids else None
        with torch.inference_mode():
            tokens, mask, logprobs, routing, end = self._sample(
                prompt_tokens,
                prompt_mask,
                max_new_tokens,
                temperature,
                top_p,
                stop_ids,
                pad_id,
                generator,
                use_kv_cache,
                score_prompt,
            )
        # Outputs are cloned outside inference mode: the trainer uses them
        # under autograd. A token is fed to the engine (routed) iff it is real
        # and not the last sampled column, which is never fed.
        mask = mask[:, :end].clone()
        response = torch.zeros_like(mask)
        response[:, p:] = mask[:, p:]
        packed = None
        if routing is not None:
            fed = mask.clone()
            if end > p:
                fed[:, -1] = False
            packed = PackedRouting(routing[:, :, :end].clone(), self.cfg.n_experts, fed)
        return RolloutBatch(
            tokens=tokens[:, :end].clone(),
            attention_mask=mask,
            response_mask=response,
            logprobs=logprobs[:, :end].clone(),
            routing=packed,
            prompt_len=p,
        )

    def _sample(
        self,
        prompt_tokens: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: torch.Tensor | None,
        pad_id: int,
        generator: torch.Generator | None,
        use_kv_cache: bool,
        score_prompt: bool = True,
    ):
        """The sampling loop of ``generate`` (run under inference mode); ``stop_ids``:
        (S,) the ids that end a row, None = rows never stop. Returns the
        (B, P + max_new_tokens) tokens, mask and log-prob buffers, the (L_moe, B,
        P + max_new_tokens, k) routing buffer (or None) and the number of columns used."""
        b, p = prompt_tokens.shape
        total = p + max_new_tokens
        tokens, mask = self._prompt_buffers(prompt_tokens, prompt_mask, total, pad_id)
        prompt_valid = mask[:, :p]
        compiled = use_kv_cache and self.decode == "compiled"
        # A compiled step writes the routing in place, into a buffer that keeps its
        # address from rollout to rollout (static for a CUDA graph, static_decode.mark_static).
        routing = self._routing_buffer(b, total, reuse=compiled)
        if use_kv_cache:
            self.forward_pass.static_cache(b, total)
            if self.weights.pos_emb is None:
                self.forward_pass.rope_table(total)
            if compiled:
                zero_cache(self)  # a bucket's attention reads all its columns: finite
                if self._compiled_step is None:
                    self._compiled_step = compiled_decode(self, _compile_mode(self.device))

        # Prefill: every prompt position at once; the LM head at every position when the
        # prompt's log-probs are asked for, else at the last one only (the next token's).
        logits = self.forward_pass.forward(
            tokens[:, :p],
            positions_from_mask(prompt_valid),
            prompt_valid,
            0 if use_kv_cache else None,
            None if routing is None else routing[:, :, :p],
            all_positions=score_prompt,
        )
        logprobs = torch.zeros((b, total), dtype=torch.float32, device=self.device)
        next_logits = logits
        if score_prompt:
            logprobs[:, :p] = prompt_logprobs(logits, tokens[:, :p], prompt_valid, temperature)
            next_logits = logits[:, -1]

        if use_kv_cache:
            n_real, key_bias = self._decode_state(prompt_valid, total)
        finished = torch.zeros(b, dtype=torch.bool, device=self.device)
        # The stop condition is read on the host every ``stop_check_every`` steps
        # only (a sync each); a loop that ran past the stop is undone below, so
        # tokens, log-probs, routing and the generator's state equal those of a
        # check after every token.
        stream = sampling_stream(generator, self.device) if temperature > 0 else None
        stream_state, stream_from, step = None, 0, -1
        # The compiled step takes the column as a device tensor, advanced in place:
        # a fresh torch.tensor([col]) per token would be a host-to-device copy
        # (a sync on CUDA) and a new input for the captured graph each time.
        col_t = torch.full((1,), p, dtype=torch.long, device=self.device) if compiled else None
        # The compiled step attends over a bucket of the cache, not all of it.
        buckets = decode_buckets(total) if compiled else []
        for step in range(max_new_tokens):
            col = p + step
            if stream is not None and stop_ids is not None and step % self.stop_check_every == 0:
                stream_state, stream_from = stream.get_state(), step
            logp = scaled_logprobs(next_logits, temperature)
            nxt = sample_next(logp, temperature, top_p, stream, self.sampler)
            if stop_ids is None:  # no row ever stops: every row is alive
                alive = None
                tokens[:, col] = nxt
                mask[:, col] = True
                logprobs[:, col] = logp.gather(-1, nxt[:, None]).squeeze(-1)
            else:
                alive = ~finished
                nxt = nxt.masked_fill(finished, pad_id)
                tokens[:, col] = nxt
                mask[:, col] = alive
                logprobs[:, col] = logp.gather(-1, nxt[:, None]).squeeze(-1) * alive
                finished = finished | (alive & torch.isin(nxt, stop_ids))
            if step == max_new_tokens - 1 or (
                alive is not None
                and (step + 1) % self.stop_check_every == 0
                and all_finished(finished, self.expert_shard)
            ):
                break
            # Feed the sampled token (the next position id = real tokens before it).
            if use_kv_cache:
                if compiled:  # the fixed-shape step: a bucket of the cache, the column as data
                    next_logits = self._compiled_step(
                        tokens[:, col],
                        n_real,
                        col_t,
                        key_bias,
                        routing,
                        bucket_for(col + 1, buckets),
                    )
                    col_t += 1
                else:
                    next_logits = self.forward_pass.decode(
                        tokens[:, col],
                        n_real,
                        col,
                        key_bias[:, None, None, : col + 1],
                        None if routing is None else routing[:, :, col],
                    )
                # Later queries see this column only where the token is real.
                if alive is None:
                    n_real += 1
                else:
                    n_real += alive
                    key_bias[:, col].masked_fill_(~alive, float("-inf"))
            else:
                next_logits = self._recompute_next(tokens, mask, col, routing)
        if stop_ids is None:
            return tokens, mask, logprobs, routing, total
        # Columns up to the last one where a row was alive (every row is alive at
        # step 0 and a stopped row stays stopped): one host read per call. Under
        # expert parallelism a rank that is done decodes pads for its group but
        # returns none of them.
        end = p + int(mask[:, p:].any(0).sum())
        stop = self._group_stop_step(end - p - 1)  # the step after which every row had stopped
        if step > stop:  # sampled past the stop: undo what a per-step check never did
            if routing is not None:
                routing[:, :, p + stop :] = 0  # columns fed only after the stop
            if stream is not None:
                replay_draws(
                    stream, stream_state, stop + 1 - stream_from, next_logits, self.sampler
                )
        return tokens, mask, logprobs, routing, end

    def _group_stop_step(self, local_stop: int) -> int:
        """The decode step at which every row had stopped: here, and under expert
        parallelism on every rank of the group (which decodes in lockstep until
        its last rank is done); ``local_stop`` is this rank's."""
        if self.expert_shard is None:
            return local_stop
        stop = torch.tensor([local_stop], device=self.device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX, group=self.expert_shard.group)
        return int(stop.item())

    def _decode_state(
        self, prompt_valid: torch.Tensor, total: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV-cache decode state, updated in place by the loop: (B,) next position ids
        (real tokens so far) and the (B, total) additive attention mask over cache columns."""
        b, p = prompt_valid.shape
        n_real = prompt_valid.sum(-1)
        key_bias = torch.zeros((b, total), dtype=torch.float32, device=self.device)
        key_bias[:, :p].masked_fill_(~prompt_valid, float("-inf"))
        return n_real, key_bias

    def _prompt_buffers(
        self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor, total: int, pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, total) token and mask buffers with the (B, P) prompt in the first columns."""
        prompt = prompt_tokens.to(self.device)
        b, p = prompt.shape
        tokens = torch.full((b, total), pad_id, dtype=torch.long, device=self.device)
        tokens[:, :p] = prompt
        mask = torch.zeros((b, total), dtype=torch.bool, device=self.device)
        mask[:, :p] = prompt_mask.to(self.device).bool()
        return tokens, mask

    def _recompute_next(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        col: int,
        routing: torch.Tensor | None,
    ) -> torch.Tensor:
        """Without a KV cache: a full forward over columns 0..col, the (B, V) logits of
        the last one; column ``col``'s routing is copied into ``routing`` (L, B, T, k)."""
        step_routing = None if routing is None else self._routing_buffer(tokens.shape[0], col + 1)
        next_logits = self.forward_pass.forward(
            tokens[:, : col + 1],
            positions_from_mask(mask[:, : col + 1]),
            mask[:, : col + 1],
            None,
            step_routing,
        )
        if routing is not None:
            routing[:, :, col] = step_routing[:, :, col]
        return next_logits

    # ------------------------------------------------------------------ helpers
    def _check_loaded(self) -> None:
        if not self.loaded:
            raise RuntimeError("call load_weights(model.state_dict()) before generating")

    def _routing_buffer(self, batch: int, length: int, reuse: bool = False) -> torch.Tensor | None:
        """(L_moe, B, length, k) zeros; ``reuse``: the engine's kept buffer of that
        shape, zeroed (callers copy out what they return)."""
        n_moe = self.n_moe_layers
        if not n_moe:
            return None
        shape = (n_moe, batch, length, self.cfg.top_k)
        kept = self._kept_routing
        if reuse and kept is not None and kept.shape == shape:
            return kept.zero_()
        buffer = torch.zeros(shape, dtype=index_dtype(self.cfg.n_experts), device=self.device)
        if reuse:
            self._kept_routing = buffer
        return buffer


def prompt_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """logprob[b, t] = log p(tokens[b, t] | tokens[b, :t]) from logits at t - 1.

    logits: (B, T, V); tokens, mask: (B, T). 0 where t or t - 1 is not a real
    token (the first real token, pads). fp32.
    """
    logp = scaled_logprobs(logits[:, :-1], temperature)
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    valid = mask[:, 1:] & mask[:, :-1]
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    out[:, 1:] = picked * valid
    return out


def _compile_mode(device: torch.device) -> str | None:
    """CUDA: "reduce-overhead" (the step captured as a CUDA graph and replayed per
    token); the CPU: the default mode (no graphs there)."""
    return "reduce-overhead" if device.type == "cuda" else None
