"""Small tokenizers with the real special-token ids of LLaDA and Dream, built in code.

A byte-level BPE over the 256 byte symbols (so any text encodes, and decodes back exactly),
with merges for a few common words; digits stay single tokens as in both models. The special
tokens sit at the families' real ids (LLaDA-8B-Instruct's and Dream-v0-Instruct-7B's special
tokens, far above the small vocabulary), and the chat templates follow the real ones: a
Llama-3-style one for LLaDA and Qwen2.5's for Dream. Saved with ``save_pretrained``, they load
with ``AutoTokenizer.from_pretrained(dir, local_files_only=True)`` and no remote code.

The merges and the saving are the package's (:mod:`dlmsearch.models.tokenizer_build`, which
builds the shipped Countdown model's tokenizer too); only the families' ids, words and the
Dream template are defined here.
"""

from __future__ import annotations

from pathlib import Path

from dlmsearch.models.tokenizer_build import LLADA_CHAT_TEMPLATE, byte_level_bpe, save_tokenizer

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
LLADA_TEMPLATE = LLADA_CHAT_TEMPLATE
DREAM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
FAMILIES = {
    "llada": dict(
        specials=LLADA_SPECIALS,
        bos="<|startoftext|>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        mask="<|mdm_mask|>",
        template=LLADA_TEMPLATE,
        vocab_size=LLADA_VOCAB,
    ),
    "dream": dict(
        specials=DREAM_SPECIALS,
        bos="<|beginoftext|>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        mask="<|mask|>",
        template=DREAM_TEMPLATE,
        vocab_size=DREAM_VOCAB,
    ),
}
WORDS = [
    "the",
    "answer",
    "is",
    "and",
    "of",
    "to",
    "a",
    "in",
    "how",
    "many",
    "much",
    "each",
    "she",
    "he",
    "they",
    "it",
    "for",
    "with",
    "numbers",
    "equation",
    "equals",
    "use",
    "exactly",
    "once",
    "reason",
    "step",
    "by",
    "final",
    "put",
    "your",
    "after",
    "please",
    "user",
    "assistant",
    "system",
    "you",
    "are",
    "helpful",
    "total",
    "apples",
    "eggs",
    "dollars",
    "day",
    "has",
    "have",
    "more",
    "than",
]


def write_tokenizer(
    directory: Path, family: str, chat_template: bool = True, add_bos: bool = False, extra: dict[str, int] | None = None
) -> None:
    """Save a tiny ``family`` ("llada" or "dream") tokenizer in ``directory``.

    ``add_bos``: the tokenizer prepends its BOS to every encoding (to test the single-BOS rule);
    ``extra``: more special tokens ``{content: id}``.
    """
    spec = FAMILIES[family]
    save_tokenizer(
        directory,
        byte_level_bpe({**spec["specials"], **(extra or {})}, WORDS),
        bos=spec["bos"],
        eos=spec["eos"],
        pad=spec["pad"],
        mask=spec["mask"],
        chat_template=spec["template"] if chat_template else None,
        prepend_bos=add_bos,
    )


def write_oversized_tokenizer(directory: Path, vocab_size: int, family: str = "llada") -> int:
    """A ``family`` tokenizer with one more special token at id ``vocab_size`` (just beyond a model
    of that vocabulary); returns that id."""
    write_tokenizer(directory, family, extra={"<|beyond|>": vocab_size})
    return vocab_size
