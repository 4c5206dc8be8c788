"""marti.types.chat_content: chat content joined into one text, every refusal naming the exact field."""

from __future__ import annotations

import pytest

from marti.errors import InvalidArgumentError
from marti.types.chat_content import content_text, utf8_text

TEXT = {"type": "text", "text": "a"}


def test_a_string_is_itself_and_parts_are_joined_with_newlines():
    assert content_text("hi", "messages[0].content") == "hi"
    parts = [TEXT, {"type": "text", "text": "b"}]
    assert content_text(parts, "messages[0].content") == "a\nb"
    assert content_text([], "messages[0].content") == ""
    kinds = {"output_text": "text", "refusal": "refusal"}
    parts = [{"type": "output_text", "text": "x"}, {"type": "refusal", "refusal": "no"}]
    assert content_text(parts, "input[1].content", kinds) == "x\nno"


@pytest.mark.parametrize(
    ("content", "kinds", "param", "said"),
    [
        (5, None, "messages[2].content", "must be a string or a list of content parts, got int 5"),
        ([TEXT, {"type": "image_url"}], None, "messages[2].content[1].type", "got type 'image_url'"),
        ([TEXT, "hi"], None, "messages[2].content[1].type", "got type None"),
        ([TEXT, {"type": "text"}], None, "messages[2].content[1].text", "has no text"),
        ([{"type": "text", "text": 5}], None, "messages[2].content[0].text", "has text 5, of type int"),
        # a kind's text is read from its own key only
        (
            [{"type": "refusal", "text": "no"}],
            {"refusal": "refusal"},
            "messages[2].content[0].refusal",
            "no refusal",
        ),
        (
            [TEXT],
            {"refusal": "refusal"},
            "messages[2].content[0].type",
            "{'type': 'refusal', 'refusal': str}",
        ),
        (
            [TEXT, {"type": "text", "text": "x\ud800"}],
            None,
            "messages[2].content",
            "character 3 is '\\ud800'",
        ),
    ],
)
def test_each_refusal_names_the_exact_field(content, kinds, param, said):
    with pytest.raises(InvalidArgumentError) as e:
        content_text(content, "messages[2].content", *([kinds] if kinds else []))
    assert e.value.param == param and said in e.value.message, e.value.message
    assert e.value.message.startswith(param.removesuffix(".type")), e.value.message


def test_utf8_text_refuses_a_lone_surrogate_naming_the_field():
    assert utf8_text("ok é", "model") == "ok é"
    with pytest.raises(InvalidArgumentError, match=r"^model is not valid Unicode text: character 1 ") as e:
        utf8_text("a\udcffb", "model")
    assert e.value.param == "model"
