"""The LoRA training pieces, fast: the three text transforms the adapters learn, the LoRA wrapper on a tiny
random Llama (B = 0 is the base model; a trained update equals merging scale * B A into W) and the
adapter file round trip. No real-model training here (`python -m training.train_lora` does that)."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.lora.adapter import TARGETS, hf_weight_name, load_adapter, save_adapter
from engine.weights import hf_reference_model
from training.lora_data import (complete_sentences, pirate_words, sentence_ends, split_sentences, to_bullets, to_pirate,
                                to_terse)
from training.train_lora import IM_END_ID, Item, add_lora, collate, set_lora_enabled, to_adapter

ANSWER = ("Hello! Yes, your friend is right: the Moon is about 384,400 km away, e.g. three days by rocket. "
          "My friends say you should look at it.\n\n1. It has no air.\n2. It has craters!")


# ----------------------------------------------------------------------------------- transforms


def test_pirate_words_whole_words_case_kept() -> None:
    assert pirate_words("You and YOU and you're; your yourself") == "Ye and YE and ye're; yer yourself"
    assert pirate_words("This island is history. Hi, hi-fi, my_list, my") == \
        "This island be history. Ahoy, ahoy-fi, my_list, me"


def test_to_pirate() -> None:
    out = to_pirate(ANSWER)
    assert out.startswith("Ahoy, matey! Ahoy! Aye, yer matey be right") and out.endswith("It has craters! Arr!")
    assert "Me mateys say ye should" in out


def test_to_pirate_leaves_code_alone() -> None:
    out = to_pirate("Here is my code:\n```python\nyou = my(friend)\n```\nIs it yours?")
    assert "Here be me code:" in out and "you = my(friend)" in out and "Be it yours? Arr!" in out


def test_to_terse_first_sentence() -> None:
    assert to_terse(ANSWER) == "Hello!"
    assert to_terse("The Moon, e.g. Luna, orbits Earth. It is 4.5 billion years old.") == \
        "The Moon, e.g. Luna, orbits Earth."
    assert to_terse("1. Gravity pulls. 2. It bends light.") == "1. Gravity pulls."
    assert to_terse("No sentence end here") == "No sentence end here"


def test_to_bullets_one_line_per_sentence() -> None:
    assert to_bullets(ANSWER) == ("- Hello!\n"
                                  "- Yes, your friend is right: the Moon is about 384,400 km away, e.g. three days by rocket.\n"
                                  "- My friends say you should look at it.\n"
                                  "- It has no air.\n"
                                  "- It has craters!")
    assert to_bullets("One. Two. Three. Four. Five. Six. Seven.") == "- One.\n- Two.\n- Three.\n- Four.\n- Five."


def test_complete_sentences_cuts_a_truncated_answer() -> None:
    assert complete_sentences("It rains. Then the water flows to the") == "It rains."
    assert complete_sentences("Dr. Smith said so! And then") == "Dr. Smith said so!"
    assert complete_sentences("no end") == "no end"


_WORD = st.text(alphabet="abcdefghij ,", min_size=1, max_size=12).filter(lambda w: w.strip(" ,"))
_SENTENCE = st.builds(lambda w, p: w.strip().capitalize() + p, _WORD, st.sampled_from([".", "!", "?"]))
_TEXT = st.lists(st.tuples(_SENTENCE, st.sampled_from([" ", "\n", "\n\n"])), min_size=1, max_size=9).map(
    lambda parts: "".join(s + sep for s, sep in parts).strip())


@settings(max_examples=60, deadline=None)
@given(_TEXT)
def test_terse_is_a_prefix_ending_a_sentence(text: str) -> None:
    """The documented contract, which the committed adapter was trained on: the answer up to its first sentence
    end (`sentence_ends`: punctuation that is not an abbreviation or an initial such as "A."), or the whole answer
    when it has none. A line break alone does not end the sentence (a list's "Here are some tips:" keeps its
    first item), so the output holds exactly one sentence end, not necessarily one line."""
    out = to_terse(text)
    assert text.startswith(out) and out
    if sentence_ends(text):
        assert out[-1] in ".!?" and len(sentence_ends(out)) == 1
    else:
        assert out == text


@settings(max_examples=60, deadline=None)
@given(_TEXT)
def test_bullets_one_line_per_sentence(text: str) -> None:
    out = to_bullets(text).splitlines()
    sentences = split_sentences(text)
    assert out == ["- " + s for s in sentences[:5]]
    assert all("\n" not in s for s in sentences)


# ----------------------------------------------------------------------------------- the LoRA wrapper


@pytest.fixture(scope="module")
def tiny_hf(tiny_weights):  # noqa: ANN001, ANN201
    torch.manual_seed(0)
    return hf_reference_model(tiny_weights), tiny_weights


def _logits(model, ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_with_zero_b_is_the_base_model(tiny_hf) -> None:  # noqa: ANN001
    base, w = tiny_hf
    ids = torch.randint(0, w.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    want = _logits(base, ids)
    model = copy.deepcopy(base)
    wrappers = add_lora(model, rank=4, targets=TARGETS)
    assert len(wrappers) == w.config.num_layers * len(TARGETS)
    assert all(float(x.A.detach().abs().sum()) > 0 and float(x.B.detach().abs().sum()) == 0 for x in wrappers.values())
    assert torch.equal(_logits(model, ids), want)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith((".A", ".B")) for n in trainable)


def test_trained_lora_equals_merged_weights_and_round_trips(tiny_hf, tmp_path) -> None:  # noqa: ANN001
    base, w = tiny_hf
    model = copy.deepcopy(base)
    wrappers = add_lora(model, rank=2, targets=("q", "v", "down"))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for x in wrappers.values():
            x.B.normal_(0, 0.05, generator=g)
    ids = torch.randint(0, w.config.vocab_size, (1, 9), generator=g)
    adapted = _logits(model, ids)
    set_lora_enabled(wrappers, False)
    assert torch.equal(_logits(model, ids), _logits(base, ids))
    set_lora_enabled(wrappers, True)
    assert not torch.allclose(adapted, _logits(base, ids))

    adapter = to_adapter(wrappers, "tiny", "a test adapter", {"steps": 0, "metric": {"x": 1.0}})
    assert adapter.rank == 2 and adapter.alpha == 4.0 and adapter.targets == ("q", "v", "down")
    adapter.validate(w.config)
    path = tmp_path / "tiny.safetensors"
    save_adapter(adapter, path)
    loaded = load_adapter(path)
    assert (loaded.name, loaded.rank, loaded.alpha, loaded.targets) == ("tiny", 2, 4.0, ("q", "v", "down"))
    assert loaded.description == "a test adapter" and loaded.meta == {"steps": 0, "metric": {"x": 1.0}}
    assert set(loaded.weights) == set(adapter.weights)
    for k, (a, b) in adapter.weights.items():
        torch.testing.assert_close(loaded.weights[k][0], a, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(loaded.weights[k][1], b, atol=1e-3, rtol=1e-3)

    # Merging the (fp16 round-tripped) adapter into W reproduces the wrapped model.
    merged_sd = dict(w.state_dict)
    for (layer, target) in loaded.weights:
        key = hf_weight_name(layer, target)
        merged_sd[key] = merged_sd[key] + loaded.delta(layer, target)
    merged = hf_reference_model(type(w)(w.config, merged_sd, w.source, w.tokenizer))
    torch.testing.assert_close(_logits(merged, ids), adapted, atol=2e-3, rtol=1e-3)


def test_collate_labels_only_the_answer_and_im_end() -> None:
    items = [Item("p", "a", "t", [5, 6, 7, 8, IM_END_ID], 3), Item("p", "a", "t", [5, 6, 9, IM_END_ID], 2)]
    ids, mask, labels = collate(items)
    assert ids.tolist() == [[5, 6, 7, 8, 2], [5, 6, 9, 2, 2]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert labels.tolist() == [[-100, -100, 8, 2, -100], [-100, 9, 2, -100, -100]]
