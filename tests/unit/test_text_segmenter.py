"""text/: sentence segmentation with offsets, the long-sentence fallback, inline tags carried
over, and the incremental segmenter agreeing with the whole-text one."""

from __future__ import annotations

import pytest

from higgs_serve.text import IncrementalSegmenter, group_segments, segment_text
from higgs_serve.text.tags import delivery_state, with_carried_tags

ARTICLE = (
    "Dr. Smith arrived at 9 a.m. on Monday. He paid $3.14 for coffee, e.g. a small latte.\n"
    "\"Is this it?\" she asked. \"Yes.\" Well... maybe not.\n\n"
    "The U.S. economy grew 2.5% in Q3. Mr. Lee et al. disagreed!"
)


def _texts(segments):
    return [s.text for s in segments]


def test_offsets_point_into_the_input():
    segments = segment_text(ARTICLE, max_chars=300)
    for s in segments:
        assert ARTICLE[s.start:s.end] == s.text
        assert s.text == s.text.strip() and s.text
    starts = [s.start for s in segments]
    assert starts == sorted(starts)
    # everything between segments is whitespace: nothing of the input is dropped
    covered = "".join(ARTICLE[a.end:b.start] for a, b in zip(segments, segments[1:]))
    assert not covered.strip()


def test_real_world_sentences():
    assert _texts(segment_text(ARTICLE, max_chars=300)) == [
        "Dr. Smith arrived at 9 a.m. on Monday.",
        "He paid $3.14 for coffee, e.g. a small latte.",
        "\"Is this it?\" she asked.",
        "\"Yes.\"",
        "Well... maybe not.",
        "The U.S. economy grew 2.5% in Q3.",
        "Mr. Lee et al. disagreed!",
    ]


def test_cjk_terminators():
    text = "你好。今天天气很好！你去吗？好的"
    assert _texts(segment_text(text, 100)) == ["你好。", "今天天气很好！", "你去吗？", "好的"]


def test_newline_without_punctuation_is_a_boundary():
    assert _texts(segment_text("First line\n\nSecond line.", 100)) == ["First line",
                                                                       "Second line."]


def test_long_sentence_splits_at_clauses_then_spaces_under_the_limit():
    sentence = ("When the committee finally met, after weeks of delay, it decided that the "
                "budget, which nobody had read in full, would be approved without changes "
                "and that the next meeting would take place in spring")
    pieces = segment_text(sentence, max_chars=60)
    assert all(len(p.text) <= 60 for p in pieces)
    assert pieces[0].text == "When the committee finally met, after weeks of delay,"
    assert " ".join(_texts(pieces)) == sentence
    no_clauses = "word " * 40
    assert all(len(p.text) <= 23 for p in segment_text(no_clauses, 23))


def test_text_without_spaces_is_cut_hard():
    text = "あ" * 250
    pieces = segment_text(text, 100)
    assert [len(p.text) for p in pieces] == [100, 100, 50]


def test_tags_stay_with_their_text_and_never_split():
    text = "Hello there. <|emotion:happy|> I won! <|prosody:pause|> Anyway. <|emotion:sad|>"
    segments = segment_text(text, 100)
    assert _texts(segments) == ["Hello there.", "<|emotion:happy|> I won!",
                                "<|prosody:pause|> Anyway. <|emotion:sad|>"]
    long = "a" * 20 + "<|emotion:happy|>" + "b" * 20
    for piece in segment_text(long, 30):
        assert piece.text.count("<|") == piece.text.count("|>")


def test_delivery_tags_carry_over_but_events_do_not():
    text = ("<|emotion:happy|><|prosody:speed_fast|> Great news. We won. <|sfx:laughter|>Haha. "
            "<|emotion:sad|> But it's over.")
    segments = segment_text(text, 100)
    assert segments[1].model_text == "<|emotion:happy|><|prosody:speed_fast|>We won."
    assert segments[2].model_text.startswith("<|emotion:happy|><|prosody:speed_fast|>")
    assert "<|sfx:laughter|>" not in segments[3].model_text.replace(segments[3].text, "")
    # a segment's own emotion replaces the carried one; speed still carries
    assert segments[3].model_text == "<|prosody:speed_fast|><|emotion:sad|> But it's over."
    assert delivery_state("<|prosody:pause|>") == {}
    assert with_carried_tags("Hi.", {}) == "Hi."


def test_grouping_packs_sentences_under_the_budget():
    groups = group_segments(ARTICLE, max_chars=90)
    assert all(len(g.text) <= 90 for g in groups)
    assert len(groups) < len(segment_text(ARTICLE, 90))
    for g in groups:
        assert ARTICLE[g.start:g.end] == g.text
    assert groups[0].text.startswith("Dr. Smith") and groups[-1].text.endswith("disagreed!")


@pytest.mark.parametrize("step", [1, 3, 7])
def test_incremental_matches_whole_text(step):
    text = ARTICLE + " <|emotion:happy|> 你好。今天天气很好！ Final words"
    seg = IncrementalSegmenter(max_chars=40)
    out = []
    for i in range(0, len(text), step):
        out += seg.feed(text[i:i + step])
    out += seg.flush()
    assert out == segment_text(text, 40)


def test_incremental_releases_a_sentence_once_text_follows_it():
    seg = IncrementalSegmenter(max_chars=100)
    assert seg.feed("Dr. Smith paid 3.") == []
    assert seg.feed("14 dollars.") == []  # the next sentence has not started yet
    assert seg.feed(" Then") == []  # a few characters of the next one first (LOOKAHEAD_CHARS)
    released = seg.feed(" we left")
    assert _texts(released) == ["Dr. Smith paid 3.14 dollars."]
    assert released[0].start == 0
    assert _texts(seg.flush()) == ["Then we left"]
    assert seg.flush() == [] and seg.pending_chars == 0


def test_incremental_waits_for_a_quote_to_close():
    seg = IncrementalSegmenter(max_chars=100)
    assert seg.feed('One. "Is this') == []
    assert _texts(seg.feed(' it?" she asked. Then we')) == ["One.", '"Is this it?" she asked.']


def test_incremental_forces_out_text_that_never_ends_a_sentence():
    seg = IncrementalSegmenter(max_chars=20, max_buffer_chars=50)
    out = []
    for _ in range(30):
        out += seg.feed("word ")
    assert out and all(len(s.text) <= 20 for s in out)
    assert seg.pending_chars <= 50


def test_incremental_does_not_wait_forever_for_a_closing_quote():
    seg = IncrementalSegmenter(max_chars=20, max_buffer_chars=60)
    out = seg.feed('He said "wait. ')
    for _ in range(20):
        out += seg.feed("More words here. ")
    assert out and seg.pending_chars <= 60 + 17


def test_whitespace_pieces_are_not_segmented_again_and_never_pile_up(monkeypatch):
    """Issue 40 item 6: each one-space message re-ran sentencex over the whole pending buffer
    (7.6 ms on the event loop for 90k characters of it), and a buffer of nothing but whitespace
    grew with every such message. A whitespace-only piece cannot end or start a sentence: it is
    appended without segmenting, and whitespace with no text before it is dropped at once."""
    from higgs_serve.text import incremental

    calls = []
    real = incremental.spans_of
    monkeypatch.setattr(incremental, "spans_of", lambda *a: calls.append(1) or real(*a))
    seg = IncrementalSegmenter(max_chars=40)
    for _ in range(10_000):
        assert seg.feed(" ") == []
    assert seg.pending_chars == 0 and calls == []
    assert seg.feed("Hello there") == [] and len(calls) == 1
    for _ in range(50):  # within the buffer's bound (4 x 40 characters)
        assert seg.feed("  ") == []
    assert len(calls) == 1
    released = seg.feed(". And now more")  # the sentence ends: segmenting resumes
    whole = segment_text(" " * 10_000 + "Hello there" + "  " * 50 + ". And now more", 40)
    assert released == whole[:-1] and seg.flush() == whole[-1:]
    assert released[0].start == 10_000  # offsets still count the dropped whitespace


@pytest.mark.parametrize("step", [1, 4])
def test_incremental_with_whitespace_pieces_matches_whole_text(step):
    text = "  " + ARTICLE.replace(" ", "   ") + "\n\n  Last one"
    seg = IncrementalSegmenter(max_chars=40)
    out = []
    for i in range(0, len(text), step):
        out += seg.feed(text[i:i + step])
        out += seg.feed("")
    out += seg.flush()
    assert out == segment_text(text, 40)
