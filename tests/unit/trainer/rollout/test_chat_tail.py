"""chat_tail_ids: the template's ids after an assistant turn (services/trainer/rollout/serving/chat_tail.py)."""

from __future__ import annotations

import pytest

from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.base import chat_to_ids
from services.trainer.rollout.serving.chat_tail import chat_tail_ids

CONVERSATION = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo there"},
    {"role": "user", "content": "and now?"},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_reply_ids_plus_tail_are_the_whole_prompt(tok):
    whole = chat_to_ids(tok, CONVERSATION)
    upto = tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=False)
    upto = upto[: upto.rfind("<|im_end|>") + len("<|im_end|>")]
    head = tok(upto, add_special_tokens=False)["input_ids"]
    tail = chat_tail_ids(tok, CONVERSATION, 1, tok.convert_tokens_to_ids("<|im_end|>"))
    assert tail is not None and head + tail == whole
    assert tok.decode(tail) == "\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"


def test_no_tail_when_it_cannot_be_cut_exactly(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert chat_tail_ids(tok, CONVERSATION, 1, tok("there", add_special_tokens=False)["input_ids"][0]) is None
    assert (
        chat_tail_ids(tok, CONVERSATION, 1, tok.convert_tokens_to_ids("<|endoftext|>")) is None
    )  # not in it
    assert chat_tail_ids(tok, CONVERSATION, 5, end) is None
    typed = [*CONVERSATION[:2], {"role": "user", "content": "say <|im_start|> please"}]
    assert chat_tail_ids(tok, typed, 1, end) is None  # special-token text: rendered whole instead
