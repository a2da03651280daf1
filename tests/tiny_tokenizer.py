"""Small tokenizers with the real special-token ids of LLaDA and Dream, built in code.

A byte-level BPE over the 256 byte symbols (so any text encodes, and decodes back exactly),
with merges for a few common words; digits stay single tokens as in both models. The special
tokens sit at the families' real ids (LLaDA-8B-Instruct's and Dream-v0-Instruct-7B's special
tokens, far above the small vocabulary), and the chat templates follow the real ones: a
Llama-3-style one for LLaDA and Qwen2.5's for Dream. Saved with ``save_pretrained``, they load
with ``AutoTokenizer.from_pretrained(dir, local_files_only=True)`` and no remote code.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, processors
from tokenizers.pre_tokenizers import ByteLevel

LLADA_VOCAB = 126464
DREAM_VOCAB = 152064

# name -> (special tokens {content: id}, bos, eos, pad, mask, chat template, model vocabulary)
LLADA_SPECIALS = {
    "<|startoftext|>": 126080,
    "<|endoftext|>": 126081,
    "<|mdm_mask|>": 126336,
    "<|start_header_id|>": 126346,
    "<|end_header_id|>": 126347,
    "<|eot_id|>": 126348,
}
DREAM_SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|beginoftext|>": 151665,
    "<|mask|>": 151666,
}
LLADA_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
DREAM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
FAMILIES = {
    "llada": dict(specials=LLADA_SPECIALS, bos="<|startoftext|>", eos="<|endoftext|>", pad="<|endoftext|>", mask="<|mdm_mask|>",
                  template=LLADA_TEMPLATE, vocab_size=LLADA_VOCAB),
    "dream": dict(specials=DREAM_SPECIALS, bos="<|beginoftext|>", eos="<|endoftext|>", pad="<|endoftext|>", mask="<|mask|>",
                  template=DREAM_TEMPLATE, vocab_size=DREAM_VOCAB),
}
WORDS = (
    "the answer is and of to a in how many much each she he they it for with numbers equation equals use "
    "exactly once reason step by final put your after please user assistant system you are helpful total "
    "apples eggs dollars day has have more than"
).split()


def _byte_level_bpe(specials: dict[str, int]) -> Tokenizer:
    """Byte-level BPE: 256 byte symbols, merges spelling out WORDS (also with a leading space)."""
    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    # Words after a space first ("\u0120" is byte-level's space), so their merges take precedence.
    for spelled in ["\u0120" + word for word in WORDS] + WORDS:
        current = spelled[0]
        for char in spelled[1:]:
            if current + char not in vocab:
                vocab[current + char] = len(vocab)
                merges.append((current, char))
            current += char
    vocab.update(specials)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer


def write_tokenizer(directory: Path, family: str, chat_template: bool = True, add_bos: bool = False, extra: dict[str, int] | None = None) -> None:
    """Save a tiny ``family`` ("llada" or "dream") tokenizer in ``directory``.

    ``add_bos``: the tokenizer prepends its BOS to every encoding (to test the single-BOS rule);
    ``extra``: more special tokens ``{content: id}``.
    """
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    specials = {**spec["specials"], **(extra or {})}
    tokenizer = _byte_level_bpe(specials)
    if add_bos:
        bos = (spec["bos"], specials[spec["bos"]])
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B", special_tokens=[bos])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        mask_token=spec["mask"],
        chat_template=spec["template"] if chat_template else None,
    )
    Path(directory).mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(directory))


def write_oversized_tokenizer(directory: Path, vocab_size: int, family: str = "llada") -> int:
    """A ``family`` tokenizer with one more special token at id ``vocab_size`` (just beyond a model
    of that vocabulary); returns that id."""
    write_tokenizer(directory, family, extra={"<|beyond|>": vocab_size})
    return vocab_size
