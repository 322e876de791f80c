"""Tokenizer, task formats, rewards, held-out split and length checks."""

from __future__ import annotations

import random
import re

import pytest

from trainer.config import ArithmeticTaskConfig, ExperimentConfig, SortTaskConfig
from trainer.config.presets import PRESETS, resolve_preset
from trainer.errors import FieldError
from trainer.tasks import (
    HELD_OUT_SHARE,
    ArithmeticTask,
    CharTokenizer,
    Problem,
    SortTask,
    check_lengths,
    make_task,
)
from trainer.tasks.arithmetic import add_scratchpad, mul_scratchpad, sub_scratchpad
from trainer.validation import validate_config


def arithmetic(**kwargs) -> ArithmeticTask:
    task = make_task(ArithmeticTaskConfig(**kwargs))
    assert isinstance(task, ArithmeticTask)
    return task


# --------------------------------------------------------------------------- tokenizer
def test_tokenizer_special_ids_and_vocab():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 51
    # Ids are fixed: '3' is the 4th digit after the 3 special tokens.
    assert tok.encode("37+58=") == [1, 6, 10, 13, 8, 11, 16]
    assert tok.encode("3", bos=False, eos=True) == [6, 2]


def test_tokenizer_round_trip_covers_every_task_format():
    tok = CharTokenizer()
    texts = [
        "37+58=",
        "7+8+0=15,3+5+1=09|95",
        "5-7-0=18,0-2-1=17,3-1-1=01|178",
        "12*4=48,12*30=360|408",
        "sort:43,7,91=",
        "7,43,91",
    ]
    for text in texts:
        ids = tok.encode(text)
        assert ids[0] == tok.bos_id
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text


def test_tokenizer_decode_stops_at_eos_and_skips_pad_bos():
    tok = CharTokenizer()
    ids = [tok.pad_id, tok.pad_id, *tok.encode("95", eos=True), *tok.encode("12")]
    assert tok.decode(ids) == "95"
    assert tok.decode([]) == ""


def test_tokenizer_rejects_unknown_characters_and_ids():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'#'"):
        tok.encode("1#2")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


# --------------------------------------------------------------------------- arithmetic formats
def test_addition_scratchpad_by_hand():
    assert add_scratchpad(37, 58) == "7+8+0=15,3+5+1=09|95"
    # The shorter operand is padded with zeros; the final carry adds a digit.
    assert add_scratchpad(5, 123) == "5+3+0=08,0+2+0=02,0+1+0=01|128"
    assert add_scratchpad(999, 1) == "9+1+0=10,9+0+1=10,9+0+1=10|1000"


def test_subtraction_scratchpad_by_hand():
    # 5-7 borrows: 15-7 = 8; 0-2-1 borrows: 10-3 = 7; 3-1-1 = 1.
    assert sub_scratchpad(305, 127) == "5-7-0=18,0-2-1=17,3-1-1=01|178"
    assert sub_scratchpad(100, 99) == "0-9-0=11,0-9-1=10,1-0-1=00|1"
    with pytest.raises(ValueError):
        sub_scratchpad(3, 5)


def test_multiplication_scratchpad_by_hand():
    assert mul_scratchpad(12, 34) == "12*4=48,12*30=360|408"
    assert mul_scratchpad(7, 105) == "7*5=35,7*0=0,7*100=700|735"


def test_problems_without_and_with_scratchpad():
    plain = arithmetic(operations=["add", "sub", "mul"])
    assert plain.build(("add", 37, 58)) == Problem("37+58=", "95", "95")
    assert plain.build(("sub", 305, 127)) == Problem("305-127=", "178", "178")
    assert plain.build(("mul", 12, 34)) == Problem("12*34=", "408", "408")
    pad = arithmetic(operations=["add", "sub", "mul"], scratchpad=True)
    assert pad.build(("add", 37, 58)).target == "7+8+0=15,3+5+1=09|95"
    assert pad.build(("sub", 305, 127)).target == "5-7-0=18,0-2-1=17,3-1-1=01|178"
    assert pad.build(("mul", 12, 34)).target == "12*4=48,12*30=360|408"


def test_scratchpad_targets_are_consistent_and_long_enough():
    task = arithmetic(operations=["add", "sub", "mul"], min_digits=2, max_digits=3, scratchpad=True)
    rng = random.Random(0)
    for p in task.sample(300, rng):
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", p.prompt).groups()
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert p.answer == str(expected) and expected >= 0
        assert task.parse_answer(p.target) == p.answer
        assert task.reward(p, p.target) == 1.0
        n_tokens = len(task.tokenizer.encode(p.target, bos=False, eos=True))
        if op in "+-":
            assert n_tokens >= 20  # 2-3 digit add/sub: 20+ response tokens
        assert n_tokens <= task.max_target_len


def test_sampling_respects_digits_operations_and_seed():
    task = arithmetic(operations=["mul", "sub"], min_digits=2, max_digits=3)
    problems = task.sample(200, random.Random(7))
    assert problems == task.sample(200, random.Random(7))
    ops = set()
    for p in problems:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", p.prompt).groups()
        ops.add(op)
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
        assert not a.startswith("0") and not b.startswith("0")
        if op == "-":
            assert int(a) >= int(b)
    assert ops == {"*", "-"}


# --------------------------------------------------------------------------- rewards
@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("95", 1.0),
        ("96", 0.0),
        ("095", 0.0),
        ("95 ", 0.0),
        ("9 5", 0.0),
        ("", 0.0),
        ("abc", 0.0),
        ("7+8+0=15,3+5+1=09|95", 1.0),  # only the final answer counts
        ("junk|95", 1.0),
    ],
)
def test_plain_arithmetic_reward(text, reward):
    task = arithmetic()
    problem = task.build(("add", 37, 58))
    assert task.reward(problem, text) == reward
    assert task.is_correct(problem, text) == (reward == 1.0)


def test_scratchpad_reward_reads_only_the_final_answer():
    task = arithmetic(scratchpad=True)
    problem = task.build(("add", 37, 58))
    assert task.reward(problem, "7+8+0=15,3+5+1=09|95") == 1.0
    # A wrong working with the right final answer is still correct.
    assert task.reward(problem, "7+8+0=99|95") == 1.0
    # The right number inside the working but a wrong final answer is wrong.
    assert task.reward(problem, "95|96") == 0.0
    # Without the separator nothing is parsed.
    assert task.parse_answer("95") is None
    assert task.reward(problem, "95") == 0.0
    assert task.reward(problem, "7+8+0=15,3+5+1=09|") == 0.0


def test_format_reward_only_for_well_formed_wrong_answers():
    task = arithmetic(scratchpad=True, format_reward=0.1)
    problem = task.build(("add", 37, 58))
    assert task.reward(problem, "7+8+0=15,3+5+1=09|95") == 1.0
    assert task.reward(problem, "7+8+0=15,3+5+1=09|96") == pytest.approx(0.1)
    assert task.reward(problem, "7+8+0=15,3+5+1=09|9x") == 0.0
    assert task.reward(problem, "96") == 0.0  # no separator: malformed
    assert not task.is_correct(problem, "7+8+0=15,3+5+1=09|96")


# --------------------------------------------------------------------------- sort
def test_sort_format_and_reward():
    task = make_task(SortTaskConfig(format_reward=0.05))
    assert isinstance(task, SortTask)
    problem = task.build((43, 7, 91))
    assert problem == Problem("sort:43,7,91=", "7,43,91", "7,43,91")
    assert task.build((5, 3, 5)).answer == "3,5,5"  # repeats stay
    assert task.reward(problem, "7,43,91") == 1.0
    assert task.reward(problem, "7,91,43") == pytest.approx(0.05)
    assert task.reward(problem, "7,43") == pytest.approx(0.05)
    for malformed in ["7,43,91,", "7, 43,91", ",7", "", "sort"]:
        assert task.reward(problem, malformed) == 0.0


def test_sort_sampling_and_long_responses():
    task = make_task(SortTaskConfig(min_len=8, max_len=10, max_value=99))
    for p in task.sample(50, random.Random(1)):
        numbers = [int(x) for x in p.prompt[len("sort:") : -1].split(",")]
        assert 8 <= len(numbers) <= 10 and all(0 <= x <= 99 for x in numbers)
        assert p.answer == ",".join(map(str, sorted(numbers)))
        assert task.is_correct(p, p.target)
    assert task.max_target_len == 10 * 2 + 9 + 1  # 10 two-digit numbers, 9 commas, EOS
    assert task.max_prompt_len == 1 + len("sort:") + 29 + 1


# --------------------------------------------------------------------------- held-out split
@pytest.mark.parametrize(
    "cfg",
    [
        ArithmeticTaskConfig(operations=["add"], min_digits=1, max_digits=2),  # enumerated space
        ArithmeticTaskConfig(operations=["add", "sub", "mul"], min_digits=2, max_digits=3),  # large
        SortTaskConfig(min_len=3, max_len=5),
    ],
)
def test_eval_set_is_deterministic_and_disjoint_from_training(cfg):
    task = make_task(cfg)
    eval_set = task.eval_set()
    assert len(eval_set) == cfg.eval_size
    assert len({p.prompt for p in eval_set}) == len(eval_set)  # unique problems
    assert eval_set == make_task(cfg).eval_set()  # same seed, same list, same order
    held_out = {p.prompt for p in eval_set}
    assert all(task.is_held_out(p) for p in eval_set)
    training = task.sample(3000, random.Random(3))
    assert not held_out & {p.prompt for p in training}
    assert not any(task.is_held_out(p) for p in training)
    other_seed = make_task(cfg.model_copy(update={"eval_seed": cfg.eval_seed + 1})).eval_set()
    assert other_seed != eval_set


def test_tiny_space_caps_eval_set_at_its_held_out_share():
    # 1-digit addition: 100 problems, 10 held out, 90 left for training.
    task = arithmetic(min_digits=1, max_digits=1, eval_size=256)
    assert task.space_size() == 100
    eval_set = task.eval_set()
    assert len(eval_set) == round(HELD_OUT_SHARE * 100) == 10
    training = {p.prompt for p in task.sample(5000, random.Random(0))}
    assert len(training) == 90  # every other problem is drawn eventually
    assert not training & {p.prompt for p in eval_set}


def test_eval_size_is_honoured_when_smaller_than_the_held_out_share():
    task = arithmetic(min_digits=1, max_digits=2, eval_size=8)
    assert len(task.eval_set()) == 8
    # Subtraction's space counts ordered pairs a >= b only.
    assert arithmetic(operations=["sub"], min_digits=1, max_digits=1).space_size() == 55


# --------------------------------------------------------------------------- lengths
@pytest.mark.parametrize(
    "cfg",
    [
        ArithmeticTaskConfig(operations=["add", "sub", "mul"], min_digits=1, max_digits=2),
        ArithmeticTaskConfig(
            operations=["add", "sub", "mul"], min_digits=1, max_digits=2, scratchpad=True
        ),
        ArithmeticTaskConfig(
            operations=["sub", "mul"], min_digits=2, max_digits=2, scratchpad=True
        ),
        SortTaskConfig(min_len=2, max_len=3, max_value=12),
    ],
)
def test_max_lengths_match_brute_force(cfg):
    task = make_task(cfg)
    tok = task.tokenizer
    problems = [task.build(s) for s in task.all_specs()]
    assert task.max_prompt_len == max(len(tok.encode(p.prompt)) for p in problems)
    assert task.max_target_len == max(
        len(tok.encode(p.target, bos=False, eos=True)) for p in problems
    )


def test_documented_scratchpad_lengths():
    add = arithmetic(min_digits=3, max_digits=3, scratchpad=True)
    assert add.max_target_len == 10 * 3 + 1 + 1  # 10 D + 1, plus EOS
    mul = arithmetic(operations=["mul"], min_digits=4, max_digits=4, scratchpad=True)
    assert mul.max_target_len == 3 * 16 + 6 * 4 + 1
    assert mul.max_prompt_len == 1 + 4 + 1 + 4 + 1


def test_every_preset_passes_the_length_check():
    for name in PRESETS:
        assert check_lengths(resolve_preset(name)) == [], name


def test_check_lengths_names_the_fields():
    cfg = ExperimentConfig.model_validate(
        {
            "model": {"max_seq_len": 24, "vocab_size": 20},
            "task": {"min_digits": 2, "max_digits": 3, "scratchpad": True},
            "rollout": {"max_new_tokens": 20},
        }
    )
    errors = dict(check_lengths(cfg))
    assert set(errors) == {"rollout.max_new_tokens", "model.max_seq_len", "model.vocab_size"}
    assert "32" in errors["rollout.max_new_tokens"]  # the longest target with EOS
    assert "29" in errors["model.max_seq_len"]  # 9-token prompt + 20 new tokens
    assert check_lengths(ExperimentConfig()) == []
    # validate_config applies the same check, so the CLI, API and form reject it too.
    with pytest.raises(FieldError) as info:
        validate_config(cfg.to_dict())
    assert "rollout.max_new_tokens" in info.value.as_dict()
