from webgguf.engine import BATCH_SECONDS, next_batch_size


def test_decode_batches_double_up_to_the_largest():
    sizes = [4]
    for _ in range(5):
        sizes.append(next_batch_size(sizes[-1], tokens_per_second=10_000, largest=32))
    assert sizes == [4, 8, 16, 32, 32, 32]


def test_a_decode_batch_holds_about_batch_seconds_of_tokens():
    # 290 tok/s (a 7B model on a fast GPU): ~29 tokens per readback, not 32.
    assert next_batch_size(32, 290, 32) == int(290 * BATCH_SECONDS)
    # A slow device streams token by token instead of in pieces of seconds.
    assert next_batch_size(4, 3.0, 32) == 1
    assert next_batch_size(1, 25.0, 32) == 2
