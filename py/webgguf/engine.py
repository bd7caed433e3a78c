"""The engine's front half, shared by every backend: a loaded model's header, config, tokenizer
and chat template; prompt construction; and the reference (numpy) generation loop.

The GPU engine (plans, GPU-resident decode loop) builds on the same `LoadedModel`.
"""

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import arch, selection
from .chat import ChatTemplate, template_from_metadata
from .gguf import GGUFHeader
from .gguf_split import read_model_header
from .sampling import SamplingParams
from .textstream import TokenStream
from .tokenizer import Tokenizer


@dataclass
class LoadedModel:
    path: Path  # the model's file (of a split model: the file it was opened by); in the browser, its name
    header: GGUFHeader  # of a split model: the merged header (gguf_split.merge)
    config: object  # arch-specific config dataclass (arch.config_from_metadata)
    tokenizer: Tokenizer
    template: ChatTemplate | None

    @classmethod
    def open(cls, path) -> "LoadedModel":
        """The model at `path`: a GGUF file, or any shard of a split model (the others beside it)."""
        return cls.from_header(read_model_header(path), path)

    @classmethod
    def from_header(cls, header: GGUFHeader, name) -> "LoadedModel":
        """Config, tokenizer and chat template from a parsed header; `name`: the file's path or name (the
        browser has only the header, read from a stream or a File)."""
        config = arch.config_from_metadata(header.metadata, list(header.tensors))
        tokenizer = Tokenizer.from_metadata(header.metadata)
        template = template_from_metadata(
            header.metadata, lambda i: tokenizer.token_bytes(i).decode("utf-8", "replace")
        )
        return cls(Path(name), header, config, tokenizer, template)

    def prompt_ids(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids for a plain prompt, or for one user message through the chat template."""
        if chat and self.template is not None:
            return self.chat_ids([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt, add_special=True, parse_special=True)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        text = self.template.render(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
        # Templates that write the BOS themselves (e.g. "{{ bos_token }}...") must not get a second one.
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids


def check_context(n_prompt: int, n_ctx: int):
    if n_prompt == 0:
        raise ValueError("the prompt is empty (no tokens)")
    if n_prompt >= n_ctx:
        raise ValueError(f"the prompt has {n_prompt} tokens; the context holds {n_ctx}")


def reference_generate(
    model: LoadedModel,
    reference,
    prompt_ids: list[int],
    params: SamplingParams,
    max_tokens: int,
    stop: list[str] = (),
    on_text: Callable[[str], None] | None = None,
    n_ctx: int | None = None,
) -> TokenStream:
    """Generate with the numpy reference; `on_text` gets each piece of text as soon as it is final."""
    import numpy as np

    from .sampling import sample

    n_ctx = n_ctx or model.config.n_ctx_train
    check_context(len(prompt_ids), n_ctx)
    stream = TokenStream(model.tokenizer, min(max_tokens, n_ctx - len(prompt_ids)), stop)
    rng = np.random.default_rng(params.seed)
    reference.reset()
    history = list(prompt_ids)
    logits = reference.forward(prompt_ids, 0)[-1]  # [n_vocab]
    while not stream.finished:
        token = sample(logits, params, history, rng)
        history.append(token)
        text = stream.feed(token)
        if text and on_text:
            on_text(text)
        if not stream.finished:
            logits = reference.forward([token], len(history) - 1)[-1]
    return stream


# ---------------------------------------------------------------- the GPU engine


# Decode steps recorded into one command buffer (one compute pass). Fewer submits cost the host less:
# on an H100, SmolLM2 decodes at 1,001 tok/s with 1 step per submit, 1,059 with 4, 1,068 with 8 and
# 963 with 32, where the GPU waits for the whole batch to be recorded (docs/PERF.md).
STEPS_PER_SUBMIT = 8

# Decode steps per readback of the sampled ids. Each readback costs a round trip before the batch after
# next can be submitted (in Chromium on an H100 about 5 ms: SmolLM2 decodes at 499 tok/s in the page
# with 4 steps per readback, 770 with 16, 1,039 with 32; docs/PERF.md "The page on a GPU"), so batches
# grow from FIRST_BATCH, doubling, up to the engine's `batch`; text must still stream, so a batch is also
# held to about BATCH_SECONDS of decoding at the speed measured so far.
FIRST_BATCH = 4
BATCH_SECONDS = 0.1


def next_batch_size(size: int, tokens_per_second: float, largest: int) -> int:
    """The next decode batch after one of `size` steps that ran at `tokens_per_second`: twice as large, at
    most `largest`, and at most BATCH_SECONDS of decoding at that speed (at least one step)."""
    return max(1, min(2 * size, largest, int(tokens_per_second * BATCH_SECONDS)))


class GpuEngine:
    """A model on the GPU with a GPU-resident decode loop.

    Per decode step nothing is read back: the sampler writes the token where the next step's
    embedding lookup reads it, and advances the position in the state buffer. The CPU submits a
    batch of steps (at most `batch`: next_batch_size), then reads the output id ring once for all of
    them, while the next batch is already running; so stopping (EOS, stop string, token budget, abort)
    wastes at most one batch.
    """

    def __init__(
        self,
        model: LoadedModel,
        backend,
        n_ctx: int = 2048,
        max_chunk: int | None = None,
        batch: int = 32,
        f16: bool = False,
        cpu_shapes: bool | None = None,
        fusions: frozenset[str] | None = None,
        int8: bool | None = None,
        int8_min_bytes: int | None = None,
        quant_out_min_outputs: int | None = None,
        source_of: Callable[[str], str] | None = None,
    ):
        """max_chunk: prompt tokens per prefill step (None: selection.prefill_chunk for the adapter);
        f16: an f16 KV cache where the adapter has shader-f16 (docs/ENGINE.md "Precision");
        cpu_shapes: the kernel shapes of CPU adapters (None: when the adapter is one); fusions: the fusion
        passes to run (None: those chosen for the adapter, passes.default_fusions); int8: large linears
        read 8-bit activations with integer dot products (None: on GPU shapes, caps.int8), from
        int8_min_bytes of weights on (None: selection.INT8_MIN_BYTES); quant_out_min_outputs: see
        AdapterCaps; `source_of(relative path) -> WGSL
        text`: where the shaders come from (None: shaders/ of the source tree; the browser passes the
        page's shaders.json)."""
        from .caps import AdapterCaps
        from .plan import GpuModel, PlanShape

        self.model = model
        self.backend = backend
        self.batch = batch
        config = model.config
        caps = AdapterCaps.of(
            backend,
            f16=f16,
            cpu_shapes=cpu_shapes,
            int8=int8,
            int8_min_bytes=int8_min_bytes,
            quant_out_min_outputs=quant_out_min_outputs,
        )
        n_ctx = min(n_ctx, config.n_ctx_train)
        max_chunk = max_chunk or selection.prefill_chunk(caps.cpu_shapes)
        score_chunk = selection.score_chunk(
            max_chunk, config.n_vocab, backend.limits.max_storage_buffer_binding_size
        )
        shape = PlanShape(n_ctx=n_ctx, max_chunk=max_chunk, score_chunk=score_chunk, ring=4 * batch + 4)
        self.gpu = GpuModel(
            config, arch.gpu_module_for(config), backend, shape, caps, fusions, source_of=source_of
        )

    @property
    def n_ctx(self) -> int:
        return self.gpu.shape.n_ctx

    def upload_from_file(self) -> None:
        """Native loading: tensor bytes straight from the memory-mapped file(s) into GPU buffers."""
        from .gguf_split import open_model

        with open_model(self.model.path) as f:
            self.gpu.upload(f.header.tensors, f.tensor_bytes)

    def release(self) -> None:
        """Free all the GPU memory of this model (GpuModel.release): `backend.live_bytes` is back where it
        was before the engine was built. The engine cannot generate afterwards; the backend stays usable
        for the next model."""
        self.gpu.release()

    def dispatches_per_decode_step(self, greedy: bool = True) -> int:
        return self.gpu.decode_plan(greedy).dispatch_count

    # ---- steps

    def _start(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Submit the prompt in chunks; the last chunk samples the first new token into ring slot 0."""
        from .state import pack_state

        self.gpu.require_alive()
        self.backend.write_buffer(self.gpu.act.state, pack_state(0, 0, 0, params, prompt_ids))
        chunk = self.gpu.shape.max_chunk
        for start in range(0, len(prompt_ids), chunk):
            ids = prompt_ids[start : start + chunk]
            last = start + len(ids) == len(prompt_ids)
            self._submit_chunk(ids, start, self.gpu.prefill_plan(len(ids), last, params.greedy))

    def _submit_chunk(self, ids: list[int], pos: int, plan) -> None:
        """Replay a prefill or scoring plan over `ids` at positions pos.. (set in the ids buffer, state)."""
        from .state import POSITION_OFFSET, pack_position

        self.backend.write_buffer(self.gpu.act.ids, struct.pack(f"<{len(ids)}I", *ids))
        self.backend.write_buffer(self.gpu.act.state, pack_position(pos, len(ids)), POSITION_OFFSET)
        self.backend.replay(plan)

    def _submit_decode(self, n: int, greedy: bool):
        """n decode steps, STEPS_PER_SUBMIT per command buffer; then a read of the id ring."""
        plan = self.gpu.decode_plan(greedy)
        for first in range(0, n, STEPS_PER_SUBMIT):
            self.backend.replay(plan, repeat=min(STEPS_PER_SUBMIT, n - first))
        return self.backend.read_async(self.gpu.act.out_ids)

    def _decode_batches(self, n_tokens: int, greedy: bool, in_flight: list):
        """After `_start`: yields (first token index, count, read of the id ring) for the n_tokens tokens
        (token 0 is the prefill's), keeping the next batch submitted while the caller waits for one. What
        is still in flight when the caller stops stays in `in_flight`, for the caller to drain."""
        in_flight.append((0, 1, self.backend.read_async(self.gpu.act.out_ids)))
        submitted = 1
        size = min(FIRST_BATCH, self.batch)
        done_at = None  # when the caller had the last batch's ids
        while in_flight:
            if submitted < n_tokens and len(in_flight) < 2:
                n = min(size, n_tokens - submitted)
                in_flight.append((submitted, n, self._submit_decode(n, greedy)))
                submitted += n
            first, n, read = in_flight.pop(0)
            yield first, n, read
            now = time.perf_counter()  # the caller has awaited `read`: the batch is done
            if done_at is not None:
                size = next_batch_size(size, n / max(now - done_at, 1e-9), self.batch)
            done_at = now

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        stop: list[str] = (),
        on_text: Callable[[str], None] | None = None,
        should_abort: Callable[[], bool] | None = None,
        ignore_eos: bool = False,
    ) -> TokenStream:
        """Generate on the GPU.

        `on_text` gets each final piece of text; `should_abort()` is polled once per batch; ignore_eos:
        end-of-generation tokens do not stop it (TokenStream)."""
        check_context(len(prompt_ids), self.n_ctx)
        budget = min(max_tokens, self.n_ctx - len(prompt_ids))
        stream = TokenStream(self.model.tokenizer, budget, stop, ignore_eos)
        if stream.finished:
            return stream
        ring = self.gpu.shape.ring
        self._start(prompt_ids, params)
        in_flight = []
        for first, n, pending in self._decode_batches(budget, params.greedy, in_flight):
            ring_ids = struct.unpack(f"<{ring}I", await pending)
            for index in range(first, first + n):
                text = stream.feed(ring_ids[index % ring])
                if text and on_text:
                    on_text(text)
                if stream.finished:
                    break
            if should_abort and should_abort():
                stream.finish_reason = stream.finish_reason or "abort"
            if stream.finished:
                break
        for _, _, pending in in_flight:  # let work already submitted drain before the next request
            await pending
        return stream

    def run_decode(self, prompt_ids: list[int], n_steps: int, greedy: bool = True) -> list[int]:
        """Benchmark helper: prefill, then exactly n_steps decode steps with no stop conditions. Like
        `generate`, it keeps the next batch submitted while it waits for the current one."""
        self._start(prompt_ids, SamplingParams())
        ids, ring = [], self.gpu.shape.ring
        for first, n, read in self._decode_batches(n_steps + 1, greedy, []):
            ring_ids = struct.unpack(f"<{ring}I", read.wait())
            ids += [ring_ids[i % ring] for i in range(first, first + n)]
        return ids

    def score_chunks(self, ids: list[int], first: int = 0):
        """Teacher forcing: yields (first position, raw f32 logits bytes [T, n_vocab]) per chunk, for
        positions `first` onwards; the ones before are only prefilled (no output head: cheaper)."""
        from .state import pack_state

        if len(ids) > self.n_ctx:
            raise ValueError(f"{len(ids)} ids exceed the context of {self.n_ctx}")
        if not 0 <= first < len(ids):
            raise ValueError(f"first scored position {first} is outside the {len(ids)} ids")
        gpu = self.gpu
        gpu.require_alive()
        n_vocab = self.model.config.n_vocab
        self.backend.write_buffer(gpu.act.state, pack_state(0, 0, 0, SamplingParams(), []))
        for start in range(0, first, gpu.shape.max_chunk):
            part = ids[start : min(start + gpu.shape.max_chunk, first)]
            self._submit_chunk(part, start, gpu.prefill_plan(len(part), last=False, greedy=True))
        for start in range(first, len(ids), gpu.shape.score_chunk):
            part = ids[start : start + gpu.shape.score_chunk]
            self._submit_chunk(part, start, gpu.score_plan(len(part)))
            yield start, self.backend.read_async(gpu.act.all_logits, 0, len(part) * n_vocab * 4)
