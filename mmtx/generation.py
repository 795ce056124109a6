"""Text generation: greedy, beam search and sampling, all over the decoder's KV cache.

The context (an image's tokens, or a question-aware joint encoding) is computed once, and each
decoder layer computes its cross-attention keys/values from it once (they live in the cache);
every step then feeds only the newest token. Beam search shares those keys/values between the
beams of an image instead of copying them, moves only the filled part of the self-attention cache
when beams are reordered, and the decoding loops never wait on an accelerator to decide whether
to stop (see :class:`_AllDone`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from mmtx.config_error import ArgumentError
from mmtx.few_row_products import few_row_products, pays_on_this_cpu
from mmtx.models.decoder import CaptionDecoder


@dataclass
class GenerationConfig:
    """How to decode. ``num_beams > 1`` selects beam search, ``do_sample`` sampling, else greedy.

    ``length_penalty`` divides a finished beam's log-probability by ``length ** length_penalty``
    (> 0 favours longer captions). ``early_stopping`` ends an image's search as soon as it has
    ``num_beams`` finished hypotheses. ``min_new_tokens`` forbids EOS before that many tokens
    (benchmarks use it to generate a fixed number of tokens).
    """

    max_new_tokens: int = 32
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_new_tokens: int = 0
    use_cache: bool = True
    # true: fp32 CPU decoding computes its few-row products as (W x^T)^T (mmtx.few_row_products);
    # false: plain F.linear; None: true where that was measured to pay (CPUs with AVX-512 kernels)
    few_row_products: bool | None = None

    def __post_init__(self) -> None:
        checks = {
            "max_new_tokens": self.max_new_tokens >= 1,
            "num_beams": self.num_beams >= 1,
            "temperature": self.temperature > 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 < self.top_p <= 1,
            "min_new_tokens": 0 <= self.min_new_tokens <= self.max_new_tokens,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ArgumentError(
                f"{{generation!k}}: invalid settings: {', '.join(f'{k}={getattr(self, k)}' for k in bad)}",
                generation=None,
            )
        if self.do_sample and self.num_beams > 1:
            raise ArgumentError("{generation!k}: choose do_sample=true or num_beams>1, not both", generation=None)


class _Stepper:
    """Next-token log-probabilities for growing sequences, with or without the KV cache."""

    def __init__(
        self,
        decoder: CaptionDecoder,
        context: Tensor,
        context_mask: Tensor | None,
        use_cache: bool,
        max_length: int,
        banned: list[int],
    ) -> None:
        self.decoder, self.context, self.context_mask = decoder, context, context_mask
        self.banned = torch.tensor(banned, dtype=torch.long, device=context.device)
        self.cache = decoder.new_cache(max_length) if use_cache else None

    def __call__(self, tokens: Tensor) -> Tensor:
        """``tokens`` (N, t): every token so far -> log-probs (N, vocab) of the next one."""
        if self.cache is not None:
            new = tokens[:, self.cache[0].self_kv.length :]  # only what the cache has not seen
            logits = self.decoder(new, self.context, context_mask=self.context_mask, cache=self.cache)
        else:
            logits = self.decoder(tokens, self.context, context_mask=self.context_mask)
        logits = logits[:, -1].float()
        logits.index_fill_(1, self.banned, -float("inf"))
        return logits.log_softmax(-1)

    def repeat_interleave(self, k: int) -> None:
        """Turn each row into ``k`` rows (beams), reusing the computed state.

        With the cache, the beams of a row share its cross-attention keys/values (and context
        mask) without copies (attention groups the beams' queries by shape); only the
        self-attention history is repeated.
        """
        if self.cache is not None:
            for block in self.cache:
                block.self_kv.repeat_interleave(k)
        else:
            self.context = self.context.repeat_interleave(k, dim=0)
            if self.context_mask is not None:
                self.context_mask = self.context_mask.repeat_interleave(k, dim=0)

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (beams of the same image share the image, so only history moves)."""
        if self.cache is not None:
            for block in self.cache:
                block.self_kv.reorder(index)


class _AllDone:
    """``done.all()`` as a Python bool, without making the host wait for an accelerator.

    On the CPU the answer is exact and free. On CUDA each call starts a non-blocking copy of the
    flag into pinned host memory and answers from the last copy that has already landed (an
    event query, never a synchronisation), so the decoding loop keeps the device busy and may run
    a step or two past the point where every row is done. Those steps change nothing: finished
    rows only receive padding (greedy, cut off at the step where the last row ended) and
    finished images' pools are frozen (beam search).
    """

    def __init__(self, device: torch.device) -> None:
        self.lagged = device.type == "cuda"
        if self.lagged:
            self.host = torch.zeros((), dtype=torch.bool).pin_memory()
            self.event: torch.cuda.Event | None = None

    def __call__(self, done: Tensor) -> bool:
        if not self.lagged:
            return bool(done.all())
        if self.event is not None and self.event.query() and bool(self.host):
            return True
        self.host.copy_(done.all(), non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()
        return False


def never_generated(bos_id: int, eos_id: int, pad_id: int) -> list[int]:
    """The ids decoding never emits: padding and a second BOS, unless one is also the EOS
    (GPT-2's ``<|endoftext|>``)."""
    return [t for t in dict.fromkeys([pad_id, bos_id]) if t != eos_id]


@torch.no_grad()
def generate(
    decoder: CaptionDecoder,
    context: Tensor,
    *,
    context_mask: Tensor | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    config: GenerationConfig | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Token ids (B, L) that ``decoder`` generates reading ``context`` (B, S, D): no BOS, padded
    after EOS. For a captioner, ``context`` is ``model.encode(images)``; ``context_mask`` (B, S)
    is True on context tokens that may be attended to (e.g. not question padding)."""
    cfg = config or GenerationConfig()
    max_length = 1 + cfg.max_new_tokens
    if max_length > decoder.max_length:
        raise ValueError(
            f"max_new_tokens={cfg.max_new_tokens} needs {max_length} positions, the decoder has {decoder.max_length}"
        )
    step = _Stepper(decoder, context, context_mask, cfg.use_cache, max_length, never_generated(bos_id, eos_id, pad_id))
    B = context.shape[0]
    on_cpu = context.device.type == "cpu"
    rerouted = on_cpu and (pays_on_this_cpu() if cfg.few_row_products is None else cfg.few_row_products)
    with few_row_products() if rerouted else nullcontext():
        if cfg.num_beams > 1:
            return _beam_search(step, B, cfg, bos_id, eos_id, pad_id, context.device)
        return _greedy_or_sample(step, B, cfg, bos_id, eos_id, pad_id, context.device, generator)


def _greedy_or_sample(
    step: _Stepper,
    B: int,
    cfg: GenerationConfig,
    bos: int,
    eos: int,
    pad: int,
    device: torch.device,
    generator: torch.Generator | None,
) -> Tensor:
    tokens = torch.full((B, 1 + cfg.max_new_tokens), pad, dtype=torch.long, device=device)
    tokens[:, 0] = bos
    done = torch.zeros(B, dtype=torch.bool, device=device)
    ended_at = torch.zeros(B, dtype=torch.long, device=device)  # the step of each row's EOS
    all_done = _AllDone(device)
    for t in range(cfg.max_new_tokens):
        logp = step(tokens[:, : t + 1])
        if t < cfg.min_new_tokens:
            logp[:, eos] = -float("inf")
        if cfg.do_sample:
            probs = filter_logits(logp / cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            nxt = logp.argmax(-1)
        tokens[:, t + 1] = torch.where(done, pad, nxt)
        ended = (nxt == eos) & ~done
        ended_at.masked_fill_(ended, t)
        done |= ended
        if t + 1 >= cfg.min_new_tokens and all_done(done):  # EOS is banned before min_new_tokens
            break
    # up to the step where the last row ended (steps run past it on a GPU only added padding)
    end = int(ended_at.max()) + 2 if bool(done.all()) else tokens.shape[1]
    return tokens[:, 1:end]


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Keep the ``top_k`` highest logits and the smallest set whose probability reaches ``top_p``
    (nucleus sampling, Holtzman et al. 2020); the rest become -inf. ``logits``: (N, V)."""
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already enough
        drop[:, 0] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    return logits


def _beam_search(
    step: _Stepper, B: int, cfg: GenerationConfig, bos: int, eos: int, pad: int, device: torch.device
) -> Tensor:
    """Batched beam search with a pool of finished hypotheses per image (as in fairseq/HF).

    Each step takes the best 2K continuations of the K live beams: those ending in EOS (and
    ranked within the top K) enter the image's finished pool, scored by length-normalised
    log-probability; the best K others live on.
    """
    K, L = cfg.num_beams, 1 + cfg.max_new_tokens
    neg_inf = -float("inf")
    alive = torch.full((B, K, L), pad, dtype=torch.long, device=device)
    alive[:, :, 0] = bos
    alive_scores = torch.full((B, K), neg_inf, device=device)
    alive_scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished = torch.full((B, K, L), pad, dtype=torch.long, device=device)
    fin_scores = torch.full((B, K), neg_inf, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    rows = torch.arange(B, device=device)[:, None] * K
    all_done = _AllDone(device)

    logp = step(alive[:, 0, :1])[:, None, :]  # (B, 1, V): first step once per image
    step.repeat_interleave(K)
    V = logp.shape[-1]
    rank = torch.arange(2 * K, device=device)[None, :]
    for t in range(cfg.max_new_tokens):
        if t > 0:
            logp = step(alive.view(B * K, L)[:, : t + 1]).view(B, K, V)
        if t < cfg.min_new_tokens:
            logp[..., eos] = neg_inf
        cand = (alive_scores[..., None] + logp).view(B, K * V)
        top_scores, top_idx = cand.topk(2 * K, dim=1)  # (B, 2K)
        src_beam, token = top_idx // V, top_idx % V
        seqs = alive.gather(1, src_beam[..., None].expand(-1, -1, L))  # (B, 2K, L), a new tensor
        seqs[:, :, t + 1] = token

        # finished pool: EOS continuations within the top K ranks, for images still searching
        ends = (token == eos) & (rank < K) & ~done[:, None]
        norm = top_scores / float(t + 1) ** cfg.length_penalty
        pool_scores = torch.cat([fin_scores, norm.masked_fill(~ends, neg_inf)], dim=1)
        new_scores, pick = pool_scores.topk(K, dim=1)
        new_finished = torch.cat([finished, seqs], dim=1).gather(1, pick[..., None].expand(-1, -1, L))
        # a finished image's pool is final (its order too, even where scores tie)
        fin_scores = torch.where(done[:, None], fin_scores, new_scores)
        finished = torch.where(done[:, None, None], finished, new_finished)

        # live beams: the best K continuations that did not end
        alive_scores, pick = top_scores.masked_fill(token == eos, neg_inf).topk(K, dim=1)
        alive = seqs.gather(1, pick[..., None].expand(-1, -1, L))
        if t + 1 < cfg.max_new_tokens:  # the last step's beams need no history for a next one
            step.reorder((rows + src_beam.gather(1, pick)).view(-1))

        full = fin_scores[:, -1] > neg_inf
        if cfg.early_stopping:
            done |= full
        else:  # stop once no live beam can still beat the worst finished one
            best_len = cfg.max_new_tokens if cfg.length_penalty > 0 else t + 1
            best_possible = alive_scores[:, 0] / float(best_len) ** cfg.length_penalty
            done |= full & (best_possible <= fin_scores[:, -1])
        if t + 1 >= cfg.min_new_tokens and all_done(done):  # no EOS, so no finished pool, before
            break

    if not bool(done.all()):  # out of steps: live beams compete with the finished ones
        live = (alive_scores / float(t + 1) ** cfg.length_penalty).masked_fill(done[:, None], neg_inf)
        pool_scores, pick = torch.cat([fin_scores, live], dim=1).topk(K, dim=1)
        finished = torch.cat([finished, alive], dim=1).gather(1, pick[..., None].expand(-1, -1, L))
    best = finished[:, 0, 1:]
    used = int((best != pad).sum(1).max().clamp(min=1))
    return best[:, :used]
