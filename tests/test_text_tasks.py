"""Text tasks without a model: tokenizers of both families, prompts, GSM8K, Countdown, answers, arithmetic."""

from __future__ import annotations

import builtins
import inspect
import json
from pathlib import Path

import attrs
import pytest
import torch
from omegaconf import OmegaConf
from tiny_tokenizer import DREAM_VOCAB, LLADA_VOCAB, write_oversized_tokenizer, write_tokenizer

from dlmsearch.config import CONF_DIR, ConfigError, build, compose
from dlmsearch.tasks.answers import extract_answer, gsm8k_reference, normalize_number, numbers_equal
from dlmsearch.tasks.arithmetic import InvalidExpression, evaluate, extract_equation, uses_exactly
from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.countdown import (
    DEFAULT_TEMPLATE,
    CountdownProblem,
    CountdownTask,
    check_equation,
    load_countdown,
    shipped_countdown_path,
)
from dlmsearch.tasks.gsm8k import DEFAULT_INSTRUCTION, GSM8KTask, load_gsm8k, shipped_gsm8k_path
from dlmsearch.tasks.prompts import PromptsTask
from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SudokuTask
from dlmsearch.tasks.text import TaskFileError

torch.set_num_threads(1)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# family -> the model config's mask_id, vocab_size and stop_ids
MODELS = {
    "llada": dict(mask_id=126336, vocab_size=LLADA_VOCAB, stop_ids=[126081, 126348]),
    "dream": dict(mask_id=151666, vocab_size=DREAM_VOCAB, stop_ids=[151643]),
}
BOS = {"llada": 126080, "dream": 151665}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny tokenizers: each family with a chat template, without one, and adding a BOS to plain text."""
    root = tmp_path_factory.mktemp("tokenizers")
    made = {}
    for family in MODELS:
        for kind, kwargs in {"chat": {}, "plain": {"chat_template": False}, "bos": {"add_bos": True}}.items():
            made[f"{family}-{kind}"] = root / f"{family}-{kind}"
            write_tokenizer(made[f"{family}-{kind}"], family, **kwargs)
    return made


def make(cls: type, tokenizers: dict[str, Path], family: str = "llada", kind: str = "chat", **kwargs):
    return cls(tokenizer=str(tokenizers[f"{family}-{kind}"]), **{**MODELS[family], **kwargs})


def ids(task, text: str) -> list[int]:
    """``text`` encoded as plain text with the task's tokenizer (what a model would generate)."""
    return task._tokenizer(text, add_special_tokens=False)["input_ids"]


def generation(task, text: str, tail: list[int] | None = None) -> torch.Tensor:
    """A finished canvas: ``text``, the first stop token, then ``tail`` (junk after the stop)."""
    return torch.tensor(ids(task, text) + [task.stop_ids[0]] + (tail or []))


# --------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She makes 9 * 2 = $18 a day.\n#### 18", "18"),
        ("#### 1,234", "1234"),
        ("#### $5\nmore text 99", "5"),  # #### wins over later numbers
        ("first #### 3 then #### 4", "3"),  # the first ####
        ("So 3 + 4 = 7. The answer is 7.", "7"),
        ("THE ANSWER IS $1,250.50", "1250.5"),
        ("the answer is: -7 degrees", "-7"),
        ("Final answer: 25", "25"),
        ("the answer is 3, no wait, the answer is 4. Check: 4 + 1 = 5", "4"),  # the last stated answer
        ("so we get \\boxed{42} in total, i.e. 40 + 2", "42"),
        ("\\boxed{\\$1,000}", "1000"),
        ("She has 5 apples and buys 12 more, 17 in all.", "17"),  # last number
        ("It costs $3.50.", "3.5"),
        ("the temperature fell to -4", "-4"),
        ("18 - 3 = 15", "15"),  # subtraction is not a sign
        ("10-5", "5"),
        ("Total: 18.0", "18"),
        ("total \u22123", "-3"),  # a Unicode minus
        ("I am not sure.", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("18.0", "18", True),
        ("18.", "18", True),
        ("$18", "18", True),
        ("1,000", "1000", True),
        ("0.50", ".5", True),
        ("-3", "3", False),
        ("18", "19", False),
        ("abc", "abc", False),
        (None, "1", False),
        ("0.1", "0.10000000001", False),
    ],
)
def test_numbers_equal(a: str | None, b: str | None, equal: bool) -> None:
    assert numbers_equal(a, b) is equal


def test_normalize_number_and_reference() -> None:
    assert (
        normalize_number("1,234.50") == "1234.5" and normalize_number("-$7.") == "-7" and normalize_number("x") is None
    )
    assert gsm8k_reference("Janet sells 9 eggs.\nShe makes $18.\n#### 18") == "18"
    assert gsm8k_reference("#### 1,600") == "1600" and gsm8k_reference("no hashes 5") is None


def test_extraction_never_sees_the_reference() -> None:
    assert list(inspect.signature(extract_answer).parameters) == ["text"]
    assert list(inspect.signature(extract_equation).parameters) == ["text"]


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    "expression, value, numbers",
    [
        ("30 + 100 - 93", 37, (30, 100, 93)),
        ("(100 - 93) * 30", 210, (100, 93, 30)),
        ("7 / 2 * 2", 7, (7, 2, 2)),
        ("-(3 - 5)", 2, (3, 5)),
        ("((1+2))*3", 9, (1, 2, 3)),
        ("1 / 3 + 1 / 3 + 1 / 3", 1, (1, 3, 1, 3, 1, 3)),
    ],
)
def test_evaluate(expression: str, value: int, numbers: tuple[int, ...]) -> None:
    result = evaluate(expression)
    assert result.value == value and result.numbers == numbers


def test_evaluate_is_exact() -> None:
    assert str(evaluate("10 / 4").value) == "5/2" and evaluate("1 / 3 * 3").value == 1


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "a + 1",
        "abs(-3)",
        "(1).real",
        "2 ** 3",
        "3.5 + 1",
        "'a' * 3",
        "True + 1",
        "7 // 2",
        "7 % 2",
        "[1, 2]",
        "lambda: 1",
        "1 if 1 else 2",
        "+3",
        "1 +",
        "",
        "x = 3",
        "1 << 2",
        "~1",
        "(" * 500 + "1" + ")" * 500,
        "9" * 20 + " + 1",
    ],
)
def test_evaluate_rejects_everything_else(expression: str) -> None:
    with pytest.raises(InvalidExpression):
        evaluate(expression)


def test_evaluate_rejects_division_by_zero() -> None:
    with pytest.raises(InvalidExpression, match="division by zero"):
        evaluate("5 / (3 - 3)")


def test_evaluate_never_calls_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert evaluate("(100 - 93) + 30").value == 37
    with pytest.raises(InvalidExpression):
        evaluate("__import__('os')")


def test_uses_exactly() -> None:
    assert uses_exactly((30, 100, 93), (93, 30, 100))
    assert not uses_exactly((30, 30, 93), (30, 100, 93))  # reuse
    assert not uses_exactly((30, 100), (30, 100, 93))  # one left out
    assert not uses_exactly((30, 100, 93, 1), (30, 100, 93))  # an extra number


@pytest.mark.parametrize(
    "text, equation",
    [
        ("I try things.\n<answer>100 - 93 + 16</answer>", "100 - 93 + 16"),
        ("<answer> (100 - 93) * 3 = 21 </answer>", "(100 - 93) * 3"),  # "= result" dropped
        (
            "<answer>1+1</answer> then <answer>100 \u00d7 2 \u00f7 4</answer>",
            "100 * 2 / 4",
        ),  # the last tag, Unicode operators
        ("<answer>$5 \\times (3 - 1)$</answer>", "5 * (3 - 1)"),  # LaTeX
        ("So the equation is 30 + 100 - 93 = 37.", "30 + 100 - 93"),
        ("Step 1: 100 - 93 = 7\nStep 2: 7 + 30 = 37\nDone.", "7 + 30"),  # the last line with an equation
        ("<answer>\n83 - 75 + 18\n", "83 - 75 + 18"),  # never closed
        ("I cannot find one.", None),
        ("The numbers are 3, 4 and 5.", None),
    ],
)
def test_extract_equation(text: str, equation: str | None) -> None:
    assert extract_equation(text) == equation


def test_check_equation() -> None:
    problem = CountdownProblem(numbers=(30, 100, 93), target=23)
    assert check_equation("100 - 93 + 16", problem).error.startswith("uses")
    assert check_equation("100 - (93 - 30) - 14", problem).error.startswith("uses")  # an extra number
    assert check_equation("30 + 30 - 37", problem).error.startswith("uses")
    found = check_equation("30 + 100 - 93", problem)
    assert not found.correct and found.value == "37" and "not 23" in found.error
    assert check_equation("93 - 100 + 30", problem).correct
    assert check_equation(None, problem).error == "no equation found"
    assert check_equation("30 / (100 - 100)", problem).error == "division by zero"
    assert check_equation("30 * 100 / 93", problem).value == "1000/31"


# --------------------------------------------------------------------------- tokenizers and shared behaviour


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_chat_prompts_follow_the_template(tokenizers: dict[str, Path], family: str) -> None:
    task = make(PromptsTask, tokenizers, family, prompt="How many eggs?", gen_length=64, block_length=32)
    (item,) = task.items()
    tokenizer = task._tokenizer
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "How many eggs?"}], add_generation_prompt=True
    )["input_ids"]
    assert item.prompt.tolist() == expected  # the same ids as the reference tokenize=True path
    text = task.prompt_text(item)
    if family == "llada":
        assert (
            text
            == "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHow many eggs?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )
        assert item.prompt.tolist().count(BOS["llada"]) == 1
    else:
        assert (
            text
            == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHow many eggs?<|im_end|>\n<|im_start|>assistant\n"
        )
    assert item.prompt.dtype == torch.long and item.prompt.dim() == 1
    assert int(item.prompt.max()) < MODELS[family]["vocab_size"] and int(item.prompt.min()) >= 0
    assert item.generation.tolist() == [MODELS[family]["mask_id"]] * 64 and item.generation.dtype == torch.long


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_raw_prompts_without_chat(tokenizers: dict[str, Path], family: str) -> None:
    for kind in ("chat", "plain"):
        task = make(PromptsTask, tokenizers, family, kind, prompt="How many eggs?", chat=False)
        (item,) = task.items()
        assert task.prompt_text(item) == "How many eggs?"


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_one_bos_where_the_tokenizer_adds_one(tokenizers: dict[str, Path], family: str) -> None:
    bos = BOS[family]
    chat = make(PromptsTask, tokenizers, family, "bos", prompt="hi").items()[0].prompt.tolist()
    raw = make(PromptsTask, tokenizers, family, "bos", prompt="hi", chat=False).items()[0].prompt.tolist()
    assert raw[0] == bos and raw.count(bos) == 1  # a Base model gets its tokenizer's BOS
    assert chat.count(bos) == (1 if family == "llada" else 0)  # only what the template writes: never two
    assert chat == make(PromptsTask, tokenizers, family, "chat", prompt="hi").items()[0].prompt.tolist()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_output_is_cut_at_the_first_stop_token(tokenizers: dict[str, Path], family: str) -> None:
    task = make(PromptsTask, tokenizers, family, prompt="hi")
    (item,) = task.items()
    mask = MODELS[family]["mask_id"]
    for stop in MODELS[family]["stop_ids"]:
        tokens = torch.tensor(ids(task, "The answer is 18.\n#### 18") + [stop] + ids(task, "#### 5") + [mask, stop])
        assert task.output(item, tokens) == "The answer is 18.\n#### 18"
    assert task.output(item, torch.tensor(ids(task, "no stop at all"))) == "no stop at all"
    assert task.output(item, torch.tensor([MODELS[family]["stop_ids"][0]] * 4)) == ""
    # special tokens before the stop are dropped; an unfinished canvas's masks too
    assert task.output(item, torch.tensor(ids(task, "a") + [BOS[family], mask] + ids(task, "b"))) == "ab"
    assert task.judge(item, tokens) is None and task.details(item, tokens) == {}


def test_token_strings(tokenizers: dict[str, Path]) -> None:
    task = make(PromptsTask, tokenizers, "llada", prompt="hi")
    assert task.token_strings(ids(task, "the 42") + [126081, 126336, 5000]) == [
        "the",
        "\u0120",
        "4",
        "2",
        "<|endoftext|>",
        "<|mdm_mask|>",
        "5000",
    ]


def test_stop_ids_default_to_the_eos(tokenizers: dict[str, Path]) -> None:
    task = PromptsTask(tokenizer=str(tokenizers["dream-chat"]), mask_id=151666, vocab_size=DREAM_VOCAB, prompt="hi")
    assert task.stop_ids == (151643,)
    assert make(PromptsTask, tokenizers, prompt="hi").stop_ids == (126081, 126348)


@pytest.mark.parametrize("missing", [None, "", "???"])
def test_missing_model_path_says_what_to_do(missing: str | None) -> None:
    with pytest.raises(ValueError, match=r"text tasks need .*model=llada\|dream model.path=DIR"):
        PromptsTask(tokenizer=missing, **MODELS["llada"], prompt="hi")


def test_tokenizer_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PromptsTask(tokenizer=str(tmp_path / "nowhere"), **MODELS["llada"], prompt="hi")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'model'} has no tokenizer files"):
        PromptsTask(tokenizer=str(tmp_path / "model"), **MODELS["llada"], prompt="hi")
    (tmp_path / "model" / "tokenizer.json").write_text("not a tokenizer")
    with pytest.raises(ValueError, match=f"cannot load the tokenizer in {tmp_path / 'model'}"):
        PromptsTask(tokenizer=str(tmp_path / "model"), **MODELS["llada"], prompt="hi")


def test_tokenizer_beyond_the_vocabulary(tmp_path: Path) -> None:
    beyond = write_oversized_tokenizer(tmp_path, LLADA_VOCAB)
    message = f"tokenizer in {tmp_path} has ids up to {beyond}, beyond the model's vocabulary of {LLADA_VOCAB}"
    with pytest.raises(ValueError, match=message):
        PromptsTask(tokenizer=str(tmp_path), **MODELS["llada"], prompt="hi")


def test_a_llada_tokenizer_with_a_dream_model_config_is_refused(tokenizers: dict[str, Path]) -> None:
    PromptsTask(
        tokenizer=str(tokenizers["llada-chat"]), **MODELS["dream"], prompt="hi"
    )  # LLaDA's ids fit Dream's vocabulary
    with pytest.raises(ValueError, match="has ids up to 151666, beyond the model's vocabulary of 126464"):
        PromptsTask(tokenizer=str(tokenizers["dream-chat"]), **MODELS["llada"], prompt="hi")


def test_chat_needs_a_template(tokenizers: dict[str, Path]) -> None:
    with pytest.raises(
        ValueError, match="has no chat template; an Instruct model needs one, or set task.chat=false for a Base model"
    ):
        make(PromptsTask, tokenizers, "dream", "plain", prompt="hi")
    assert make(PromptsTask, tokenizers, "dream", "plain", prompt="hi", chat=False).items()


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(gen_length=100, block_length=32), "gen_length=100 must be a multiple of task.block_length=32"),
        (dict(limit=0), "limit must be within"),
        (dict(gen_length="256"), "gen_length must be an integer"),
        (dict(chat="yes"), "chat must be true or false"),
        (dict(stop_ids="126081"), "stop_ids must be a list of token ids"),
        (dict(stop_ids=[200000]), r"stop_ids \[200000\] are outside"),
    ],
)
def test_field_errors(tokenizers: dict[str, Path], fields: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make(PromptsTask, tokenizers, prompt="hi", **fields)


# --------------------------------------------------------------------------- task=prompts


def test_prompts_from_files(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    lines = tmp_path / "prompts.txt"
    lines.write_text("first prompt\n\n  \nsecond prompt\n")
    task = make(PromptsTask, tokenizers, path=str(lines), chat=False)
    assert [(i.id, task.prompt_text(i)) for i in task.items()] == [
        ("prompts:1", "first prompt"),
        ("prompts:4", "second prompt"),
    ]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a", "id": "x"}) + "\n\n" + json.dumps({"prompt": "b", "text": "c"}) + "\n")
    assert [
        (i.id, make(PromptsTask, tokenizers, path=str(jsonl), chat=False).prompt_text(i))
        for i in make(PromptsTask, tokenizers, path=str(jsonl), chat=False).items()
    ] == [("x", "a"), ("p:3", "b")]
    only = make(PromptsTask, tokenizers, path=str(jsonl), chat=False, limit=1).items()
    assert len(only) == 1
    jsonl.write_text(json.dumps({"text": "c"}) + "\n")
    assert make(PromptsTask, tokenizers, path=str(jsonl), field="text", chat=False).items()[0].id == "p:1"


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt": "a"}\n{"prompt": "b"\n', r"p.jsonl:2: not JSON"),
        (b'{"prompt": "a"}\n{"text": "b"}\n', r"p.jsonl:2: no field 'prompt' \(fields: text\)"),
        (b'["a"]\n', r"p.jsonl:1: expected a JSON object"),
        (b'{"prompt": 3}\n', r"p.jsonl:1: field 'prompt' must be a non-empty string"),
        (b'{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', r"p.jsonl: id '1' appears more than once"),
        (b"", r"p.jsonl is empty"),
        (b"\n  \n", r"p.jsonl is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", r"p.jsonl is not a UTF-8 text file"),
        (b"\xff\xfe\xfd prompt", r"p.jsonl is not a UTF-8 text file"),
    ],
)
def test_prompt_file_errors(tokenizers: dict[str, Path], tmp_path: Path, content: bytes, message: str) -> None:
    file = tmp_path / "p.jsonl"
    file.write_bytes(content)
    task = make(PromptsTask, tokenizers, path=str(file))
    with pytest.raises(TaskFileError, match=message):
        task.items()


def test_binary_and_missing_plain_files(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(TaskFileError, match=f"{binary} is not a UTF-8 text file"):
        make(PromptsTask, tokenizers, path=str(binary)).items()
    with pytest.raises(FileNotFoundError, match="nothing.txt does not exist"):
        make(PromptsTask, tokenizers, path=str(tmp_path / "nothing.txt")).items()


def test_prompts_need_exactly_one_source(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of task.path"):
        make(PromptsTask, tokenizers)
    with pytest.raises(ValueError, match="exactly one of task.path"):
        make(PromptsTask, tokenizers, path=str(tmp_path / "p.txt"), prompt="hi")
    with pytest.raises(ValueError, match="task.prompt is empty"):
        make(PromptsTask, tokenizers, prompt="  ")


# --------------------------------------------------------------------------- task=gsm8k


def test_shipped_gsm8k_split() -> None:
    path = shipped_gsm8k_path()
    problems = load_gsm8k(path)
    assert len(problems) == 1319 and len({i for i, _ in problems}) == 1319
    assert problems[0][1].reference == "18" and problems[0][0] == "test:1"
    assert (path.parent / "LICENSE").read_text().startswith("MIT License")
    if (SHARED / "gsm8k" / "test.jsonl").is_file():
        assert path.read_bytes() == (SHARED / "gsm8k" / "test.jsonl").read_bytes()
        assert (path.parent / "LICENSE").read_bytes() == (SHARED / "gsm8k" / "LICENSE").read_bytes()


def test_gsm8k_task(tokenizers: dict[str, Path]) -> None:
    task = make(GSM8KTask, tokenizers, "dream", limit=3)
    items = task.items()
    assert [i.id for i in items] == ["test:1", "test:2", "test:3"] and items[0].reference.reference == "18"
    assert task.prompt_text(items[0]).endswith(
        f"at the farmers' market?\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    right = generation(task, "She sells 16 - 3 - 4 = 9 eggs and makes 9 * 2 = $18.\n#### 18", ids(task, "#### 7"))
    wrong = generation(task, "She makes $20.\n#### 20")
    assert task.judge(items[0], right) is True and task.judge(items[0], wrong) is False
    assert task.details(items[0], right) == {"answer": "18", "reference": "18"}
    assert task.details(items[0], generation(task, "I do not know")) == {"answer": None, "reference": "18"}
    shown = task.render(items[0], task.output(items[0], right))
    assert "Janet" in shown and "answer: 18 (reference 18): correct" in shown
    assert "WRONG" in task.render(items[0], task.output(items[0], wrong))
    assert len(task.render(items[0], "x").splitlines()[0]) < 320  # the question is shortened


def test_gsm8k_answer_comes_from_the_text_only(tokenizers: dict[str, Path]) -> None:
    task = make(GSM8KTask, tokenizers, limit=1)
    (item,) = task.items()
    tokens = generation(task, "The answer is 20")
    other = TaskItem(
        id=item.id,
        prompt=item.prompt,
        generation=item.generation,
        reference=attrs.evolve(item.reference, reference="20"),
    )
    assert task.details(item, tokens)["answer"] == task.details(other, tokens)["answer"] == "20"
    assert task.judge(item, tokens) is False and task.judge(other, tokens) is True  # only the judge uses the reference


def test_gsm8k_from_a_path_and_no_instruction(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    file = tmp_path / "mine.jsonl"
    file.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}) + "\n")
    task = make(GSM8KTask, tokenizers, path=str(file), instruction="", chat=False)
    (item,) = task.items()
    assert item.id == "mine:1" and task.prompt_text(item) == "What is 2 + 2?" and item.reference.reference == "4"
    file.write_text(json.dumps({"question": "q", "answer": "no final number"}) + "\n")
    with pytest.raises(TaskFileError, match=r"mine.jsonl:1: the answer does not end in '#### N'"):
        task.items()
    file.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(TaskFileError, match=r"mine.jsonl:1: no field 'answer'"):
        task.items()


# --------------------------------------------------------------------------- task=countdown


def test_shipped_countdown_split() -> None:
    path = shipped_countdown_path()
    problems = load_countdown(path)
    assert len(problems) == 256 and problems[0][1] == CountdownProblem(numbers=(30, 100, 93), target=23)
    assert "Apache License" in (path.parent / "LICENSE").read_text()
    if (SHARED / "d1" / "countdown_cd3_test.jsonl").is_file():
        assert path.read_bytes() == (SHARED / "d1" / "countdown_cd3_test.jsonl").read_bytes()
        assert (path.parent / "LICENSE").read_bytes() == (SHARED / "d1" / "LICENSE").read_bytes()


def test_countdown_task(tokenizers: dict[str, Path]) -> None:
    task = make(CountdownTask, tokenizers, "llada", limit=2)
    items = task.items()
    assert len(items) == 2 and items[0].reference == CountdownProblem(numbers=(30, 100, 93), target=23)
    assert "Using the numbers 30, 100, 93, write an equation that equals 23." in task.prompt_text(items[0])
    right = generation(
        task, "100 - 93 = 7, and 30 - 7 = 23.\n<answer>30 - (100 - 93)</answer>", ids(task, "<answer>1</answer>")
    )
    assert task.judge(items[0], right) is True
    assert task.details(items[0], right) == {"equation": "30 - (100 - 93)", "value": "23", "why_wrong": None}
    reuse = generation(task, "<answer>30 - 7</answer>")
    assert task.judge(items[0], reuse) is False and task.details(items[0], reuse)["why_wrong"].startswith("uses 30, 7")
    unsafe = generation(task, "<answer>__import__('os')</answer>")
    assert task.judge(items[0], unsafe) is False and task.details(items[0], unsafe)["equation"] is None
    assert "correct" in task.render(items[0], task.output(items[0], right))
    assert "WRONG (equals 37, not 23)" in task.render(items[0], "30 + 100 - 93")


def test_countdown_file_errors_and_template(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    file = tmp_path / "cd.jsonl"
    file.write_text('{"input": "1,2,x", "output": "3"}\n')
    with pytest.raises(TaskFileError, match=r"cd.jsonl:1: 'input' must be whole numbers"):
        make(CountdownTask, tokenizers, path=str(file)).items()
    with pytest.raises(ValueError, match=r"template must contain \{numbers\} and \{target\}"):
        make(CountdownTask, tokenizers, template="Reach {target}.")
    file.write_text('{"input": "1,2,3", "output": "6"}\n')
    task = make(CountdownTask, tokenizers, path=str(file), chat=False, template="{numbers} -> {target}")
    assert task.prompt_text(task.items()[0]) == "1, 2, 3 -> 6"


# --------------------------------------------------------------------------- configs and the protocol


@pytest.mark.parametrize("name, cls", [("prompts", PromptsTask), ("gsm8k", GSM8KTask), ("countdown", CountdownTask)])
def test_task_configs(name: str, cls: type) -> None:
    cfg = OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml")
    assert cfg._target_ == f"{cls.__module__}.{cls.__name__}"
    for key in (
        "tokenizer",
        "mask_id",
        "vocab_size",
        "stop_ids",
        "chat",
        "gen_length",
        "block_length",
        "limit",
        "path",
    ):
        assert key in cfg
    assert cfg.gen_length == 256 and cfg.block_length == 32 and cfg.chat is True
    for key, value in OmegaConf.to_container(cfg, resolve=False).items():
        if key != "_target_" and not (isinstance(value, str) and value.startswith("${")):
            field = attrs.fields_dict(cls)[key]
            assert field.default == value, key  # the YAML and the class agree


def test_defaults_match_the_yaml() -> None:
    assert OmegaConf.load(CONF_DIR / "task" / "gsm8k.yaml").instruction == DEFAULT_INSTRUCTION
    assert OmegaConf.load(CONF_DIR / "task" / "countdown.yaml").template is None  # the class's DEFAULT_TEMPLATE
    assert attrs.fields_dict(CountdownTask)["template"].converter(None) == DEFAULT_TEMPLATE


def test_composed_text_task(tokenizers: dict[str, Path]) -> None:
    directory = tokenizers["llada-chat"]
    task = build(
        compose(["model=llada", f"model.path={directory}", "task=gsm8k", "task.limit=2", "decoding=text"]), "task"
    )
    assert isinstance(task, GSM8KTask) and task.mask_id == 126336 and task.vocab_size == LLADA_VOCAB
    assert len(task.items()) == 2
    with pytest.raises(ConfigError, match=r"model=llada\|dream model.path=DIR"):
        build(compose(["task=gsm8k", "decoding=text"]), "task")  # the Sudoku model has no tokenizer
    with pytest.raises(ConfigError, match=r"model=llada\|dream model.path=DIR"):
        build(compose(["model=dream", "task=countdown", "decoding=text"]), "task")  # model.path left as ???


def test_tasks_have_the_whole_protocol(tokenizers: dict[str, Path]) -> None:
    tasks = [
        make(PromptsTask, tokenizers, prompt="hi"),
        make(GSM8KTask, tokenizers),
        make(CountdownTask, tokenizers),
        SudokuTask(limit=1),
    ]
    for task in tasks:
        for member in (
            "name",
            "gen_length",
            "block_length",
            "items",
            "judge",
            "output",
            "details",
            "token_strings",
            "render",
        ):
            assert hasattr(task, member), (task.name, member)


def test_sudoku_details_and_token_strings() -> None:
    task = SudokuTask(limit=1)
    (item,) = task.items()
    assert task.details(item, item.generation) == {}
    assert task.token_strings([0, 4, 8, SUDOKU_MASK_ID]) == ["1", "5", "9", "_"]
