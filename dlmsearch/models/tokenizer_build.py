"""Building small byte-level BPE tokenizers in code, saved as real Hugging Face tokenizers.

A byte-level BPE over the 256 byte symbols (any text encodes and decodes back exactly), with
merges that spell out a few whole words, and special tokens at chosen ids. Saved with
``save_pretrained`` it loads with ``AutoTokenizer.from_pretrained(dir, local_files_only=True)``
and no remote code. The shipped Countdown model's tokenizer and the tests' tiny LLaDA/Dream
tokenizers are built here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, processors
from tokenizers.pre_tokenizers import ByteLevel

SPACE = "\u0120"  # byte-level BPE's symbol for a space


def byte_level_bpe(
    specials: dict[str, int], words: tuple[str, ...] | list[str], spaced_words: bool = True, number_digits: int = 1
) -> Tokenizer:
    """256 byte symbols, merges spelling out ``words`` (also after a space, when ``spaced_words``), ``specials`` at their ids.

    ``number_digits`` > 1: every string of up to that many digits is one token (merges for
    every split of it, so whichever pair merges first the whole number ends as one token).
    """
    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    for length in range(2, number_digits + 1):
        for value in range(10**length):
            digits = f"{value:0{length}d}"
            vocab[digits] = len(vocab)
            merges += [(digits[:cut], digits[cut:]) for cut in range(1, length)]
    # Words after a space first, so their merges take precedence.
    for spelled in ([SPACE + word for word in words] if spaced_words else []) + list(words):
        current = spelled[0]
        for char in spelled[1:]:
            if current + char not in vocab:
                vocab[current + char] = len(vocab)
                merges.append((current, char))
            current += char
    clash = [s for s, i in specials.items() if i in vocab.values()]
    if clash:
        raise ValueError(
            f"special tokens {clash} take ids the byte vocabulary already uses (it has {len(vocab)} entries)"
        )
    vocab.update(specials)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer


def save_tokenizer(
    directory: Path,
    tokenizer: Tokenizer,
    *,
    bos: str,
    eos: str,
    pad: str,
    mask: str,
    chat_template: str | None,
    prepend_bos: bool = False,
    **extra: Any,
) -> None:
    """Save as ``PreTrainedTokenizerFast`` (``tokenizer.json`` + ``tokenizer_config.json``).

    Args:
        directory: where the files go (created if missing).
        tokenizer: the built ``tokenizers`` tokenizer (its post-processor is set when ``prepend_bos``).
        bos: the beginning-of-sequence token's text.
        eos: the end-of-sequence token's text.
        pad: the padding token's text.
        mask: the mask token's text.
        chat_template: the Jinja chat template, or None for a tokenizer without one.
        prepend_bos: encoding puts ``bos`` before every text (a tokenizer that adds its own BOS).
        **extra: further ``PreTrainedTokenizerFast`` settings, saved in ``tokenizer_config.json``.
    """
    from transformers import PreTrainedTokenizerFast

    if prepend_bos:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
        )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        mask_token=mask,
        chat_template=chat_template,
        **extra,
    )
    Path(directory).mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(directory))


# LLaDA-8B-Instruct's chat template (Llama-3 style): BOS, then per message a header and the
# trimmed content closed by <|eot_id|>; the generation prompt opens the assistant's header.
LLADA_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
