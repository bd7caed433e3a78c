"""A gate for abort tests, installed from a test into the page's worker: the next generation of the page's
engine holds its batches of token ids, from a given batch on, until the abort of that generation has
reached the worker.

Without it, a test that clicks Stop "while the reply streams" or aborts "during the prefill" after a
delay passes or fails with the speed of the GPU: SwiftShader takes seconds per step, a real GPU
milliseconds. With the gate the order is fixed: the batch waits in the worker, the worker tells the page
(a {type: "generation_held"} message on the engine's Worker), the page aborts, and only then is the
batch read and the stop condition checked, as the engine does after every batch.
"""

from page_calls import run_python

HOLD_LIMIT_S = 120  # a gate that sees no abort lets the generation go on (the test then fails on its result)

INSTALL = """
import asyncio, time
import js, webgguf_worker
from pyodide.ffi import to_js


def hold_next_generation(at_batch, limit_s):
    session = webgguf_worker.session
    engine = session.engine
    batches = type(engine)._decode_batches  # GpuEngine.generate reads its token ids through it

    async def after_abort(pending):
        js.postMessage(to_js({"type": "generation_held"}, dict_converter=js.Object.fromEntries))
        deadline = time.monotonic() + limit_s
        while not session.abort_requested and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return await pending

    def held_batches(n_tokens, greedy, in_flight):
        del engine._decode_batches  # this generation only
        for index, (first, n, pending) in enumerate(batches(engine, n_tokens, greedy, in_flight)):
            yield first, n, (after_abort(pending) if index >= at_batch else pending)

    engine._decode_batches = held_batches


hold_next_generation(AT_BATCH, LIMIT_S)
"""
REMOVE = "import webgguf_worker\nwebgguf_worker.session.engine.__dict__.pop('_decode_batches', None)\n"


def hold_next_generation(page, at_batch: int) -> None:
    """Batch `at_batch` (0: the token the prefill samples; then batches of the engine's `batch` decode
    steps) and those after it wait, in the next generation, until that generation is aborted."""
    code = INSTALL.replace("AT_BATCH", str(at_batch)).replace("LIMIT_S", str(HOLD_LIMIT_S))
    run_python(page, code)


def remove_gate(page) -> None:
    """Takes out a gate that no generation used (a test that failed before it generated)."""
    run_python(page, REMOVE)
