from webgguf.textstream import TokenStream


class FakeTokenizer:
    """Each id is one byte of text; id 0 ends generation."""

    eog_ids = {0}

    def incremental_decoder(self):
        class Decoder:
            def feed(self, token_id):
                return chr(token_id)

            def flush(self):
                return ""

        return Decoder()


def feed_all(stream, text):
    pieces = []
    for ch in text:
        pieces.append(stream.feed(ord(ch)))
        if stream.finished:
            break
    return pieces


def test_max_tokens_stops_with_length():
    stream = TokenStream(FakeTokenizer(), max_tokens=3)
    assert "".join(feed_all(stream, "abcdef")) == "abc"
    assert stream.finish_reason == "length" and stream.ids == [97, 98, 99]


def test_end_of_generation_token_is_not_emitted():
    stream = TokenStream(FakeTokenizer(), max_tokens=10)
    feed_all(stream, "ab")
    assert stream.feed(0) == "" and stream.finish_reason == "stop" and stream.ids == [97, 98]


def test_ignore_eos_takes_end_of_generation_ids_as_text():
    stream = TokenStream(FakeTokenizer(), max_tokens=3, ignore_eos=True)
    assert [stream.feed(i) for i in (97, 0, 98)] == ["a", "\x00", "b"]
    assert stream.finish_reason == "length" and stream.ids == [97, 0, 98]


def test_stop_string_is_cut_and_its_prefix_held_back():
    stream = TokenStream(FakeTokenizer(), max_tokens=50, stop=["END"])
    pieces = feed_all(stream, "hi ENxEND more")
    assert pieces[3] == "" and pieces[4] == ""  # "E", "N" could start "END": held back
    assert pieces[5] == "ENx"  # released once it cannot
    assert stream.text == "hi ENx" and stream.finish_reason == "stop"


def test_held_text_is_released_at_the_token_limit():
    stream = TokenStream(FakeTokenizer(), max_tokens=3, stop=["xyz"])
    assert "".join(feed_all(stream, "axy")) == "axy"


def test_zero_max_tokens_is_finished_at_once():
    assert TokenStream(FakeTokenizer(), max_tokens=0).finished
