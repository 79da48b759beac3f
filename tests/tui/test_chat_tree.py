"""The chat tree (issue 18, item 3): branches forked at a message, kept around the branch on
screen; switching shows another and keeps every one; files keep them; exports write the branch
on screen."""
from __future__ import annotations

import pytest

from memra_tui.chats import Chat, ChatFileError, ChatMessage


def msg(role: str, text: str) -> ChatMessage:
    return ChatMessage(role, text, created=1.0)


def chat() -> Chat:
    return Chat("c1", messages=[msg("user", "hi"), msg("assistant", "hello A"), msg("user", "more"),
                                msg("assistant", "more A")], created=1.0, updated=1.0)


def texts(c: Chat) -> list[str]:
    return [m.content for m in c.messages]


def test_a_fork_shows_the_new_branch_and_keeps_the_old():
    c = chat()
    c.fork(1, [msg("assistant", "hello B")])
    assert texts(c) == ["hi", "hello B"] and c.siblings(1) == (1, 2)
    c.switch(1, 0)
    assert texts(c) == ["hi", "hello A", "more", "more A"] and c.siblings(1) == (0, 2)
    c.fork(1, [msg("assistant", "hello C")])
    assert texts(c) == ["hi", "hello C"] and c.siblings(1) == (2, 3)
    c.switch(1, 1)
    assert texts(c) == ["hi", "hello B"] and c.siblings(1) == (1, 3)
    c.switch(1, 0)
    assert texts(c) == ["hi", "hello A", "more", "more A"]
    assert c.siblings(0) == (0, 1) and c.siblings(3) == (0, 1)
    with pytest.raises(IndexError):
        c.switch(1, 3)


def test_forks_inside_a_branch_travel_with_it():
    c = chat()
    c.fork(3, [msg("assistant", "more B")])  # a fork deep in branch A
    c.fork(1, [msg("assistant", "hello B")])
    c.switch(1, 0)
    assert texts(c) == ["hi", "hello A", "more", "more B"] and c.siblings(3) == (1, 2)
    c.switch(3, 0)
    assert texts(c)[-1] == "more A"


def test_a_saved_chat_keeps_its_branches_and_exports_the_one_on_screen():
    c = chat()
    c.fork(1, [msg("assistant", "hello B"), msg("user", "and B?"), msg("assistant", "yes B")])
    c.fork(3, [msg("assistant", "no B")])
    back = Chat.from_json(c.to_json())
    assert back == c and back.to_json() == c.to_json()
    back.switch(1, 0)
    assert texts(back) == ["hi", "hello A", "more", "more A"]
    md = c.to_markdown()
    assert "hello B" in md and "no B" in md and "hello A" not in md and "yes B" not in md
    assert "(branch 2 of 2)" in md


def test_a_dropped_context_stays_dropped_before_the_fork():
    c = chat()
    c.context_start = 2
    c.fork(1, [msg("assistant", "hello B")])
    assert c.context_start == 1


@pytest.mark.parametrize("field,bad", [("branches", '"x"'), ("branches", "[[]]"), ("branch", "5"), ("branch", "true")])
def test_bad_branch_fields_are_one_line_errors(field, bad):
    good = '"branches": []' if field == "branches" else '"branch": 0'
    text = chat().to_json().replace(good, f'"{field}": {bad}', 1)
    assert text != chat().to_json()
    with pytest.raises(ChatFileError) as err:
        Chat.from_json(text)
    assert "\n" not in str(err.value) and "branch" in str(err.value)
