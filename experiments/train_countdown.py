"""Train the Countdown model that dlmsearch ships, in LLaDA's checkpoint format, as LLaDA's SFT trains.

Each row is the chat-templated prompt (encoded by the task itself, so training sees exactly the
ids decoding sees) followed by a response of ``gen_length`` tokens: the worked answer
``a op b=x,x op c=t``, ``<|eot_id|>``, then ``<|endoftext|>`` to the end. Only response tokens
are masked, each with probability ``t ~ U(0, 1)`` per row; the loss is LLaDA's SFT loss
(cross-entropy of masked tokens weighted by ``1/t``, divided by the response length).
Problems are drawn on the fly (a curriculum from small numbers to larger ones), never with a
number set of a shipped tier; ``curriculum.four_fraction`` of them have four numbers (answers of
three steps). ``init_from`` continues a trained model (a shipped directory) instead of starting
from random weights. Checkpoints (weights, optimiser, step, RNG) are written every
``checkpoint_every`` steps, with the held-out accuracy of ``eval_decoders``; starting again with
the same ``out_dir`` resumes.

    python experiments/train_countdown.py                              # resumable
    python experiments/train_countdown.py max_minutes=60               # stop after an hour, resume later
    python experiments/train_countdown.py steps=20 out_dir=/tmp/cd model.n_layers=1 checkpoint_every=10
"""

from __future__ import annotations

import shutil
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.llada_checkpoint import save_llada
from dlmsearch.models.native import checkpoint_family, load_native, read_config
from dlmsearch.models.tokenizer_build import LLADA_CHAT_TEMPLATE, byte_level_bpe, save_tokenizer
from dlmsearch.models.trained_on import write_trained_on
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.tasks.countdown import TIERS, CountdownTask, load_countdown, shipped_countdown_path
from dlmsearch.tasks.countdown_problems import CountdownProblem, draw_worked
from dlmsearch.training import Checkpointer, TrainingLoop, checkpoint_accuracy

# LLaDA's special tokens, at small ids just above the byte vocabulary and the whole numbers.
SPECIALS = {
    "<|startoftext|>": 1400,
    "<|endoftext|>": 1401,
    "<|mdm_mask|>": 1402,
    "<|start_header_id|>": 1403,
    "<|end_header_id|>": 1404,
    "<|eot_id|>": 1405,
}
VOCAB_SIZE = 1408
NUMBER_DIGITS = 3  # 0-999 are one token each: copying a number and each step's arithmetic are one token
WORDS = ("Make", "from", "user", "assistant", "\u010a\u010a")  # "\u010a\u010a": byte-level "\n\n"
FREQUENCIES = Path(__file__).resolve().parents[1] / "dlmsearch" / "data" / "countdown_model" / "token_frequencies.json"
"""PC-Sampler's token-frequency table of the shipped model (the same tokenizer), which each exported directory names."""
MASK_ID, EOS_ID, EOT_ID = SPECIALS["<|mdm_mask|>"], SPECIALS["<|endoftext|>"], SPECIALS["<|eot_id|>"]


def write_countdown_tokenizer(directory: Path) -> None:
    """The model's tokenizer (bytes, whole numbers below 1000, a few whole words, LLaDA's specials and
    chat template), and PC-Sampler's token-frequency table that ``trained_on.json`` names."""
    save_tokenizer(
        directory,
        byte_level_bpe(SPECIALS, WORDS, number_digits=NUMBER_DIGITS),
        bos="<|startoftext|>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        mask="<|mdm_mask|>",
        chat_template=LLADA_CHAT_TEMPLATE,
    )
    if FREQUENCIES.is_file() and not (directory / FREQUENCIES.name).is_file():
        shutil.copyfile(FREQUENCIES, directory / FREQUENCIES.name)


def held_out_triples() -> set[tuple[int, ...]]:
    """Every number set (three or four numbers) of every shipped tier: never trained on."""
    return {p.key() for tier in TIERS for _, p in load_countdown(shipped_countdown_path(tier))}


class ProblemSampler:
    """Training problems with one worked answer each, numbers growing with ``done`` (the curriculum)."""

    def __init__(self, cfg: DictConfig, rng: np.random.Generator, excluded: set[tuple[int, ...]]) -> None:
        self.cfg, self.rng, self.excluded = cfg, rng, excluded

    def high(self, done: float) -> int:
        c = self.cfg
        return round(c.start_high + (c.high - c.start_high) * min(1.0, done / c.ramp))

    def count(self) -> int:
        """How many numbers the next problem has: four with probability ``four_fraction``, else three
        (no draw at all when it is 0, so runs without four-number problems keep their data order)."""
        four = self.cfg.get("four_fraction", 0.0)
        return 4 if four > 0 and self.rng.random() < four else 3

    def draw(self, done: float) -> tuple[CountdownProblem, str]:
        c = self.cfg
        count = self.count()
        wide = done >= c.ramp and self.rng.random() < c.wide_fraction
        while True:
            problem, answers = draw_worked(self.rng, 1, c.wide_high if wide else self.high(done), count)
            if problem.key() not in self.excluded:
                return problem, answers[self.rng.integers(len(answers))]


def native_weights(directory: Path, family: str) -> dict[str, torch.Tensor]:
    """The weights of a LLaDA or SDAR checkpoint directory (a shipped model, to continue training it)."""
    config = read_config(directory)
    module = load_native(directory, config, checkpoint_family(directory, config, family), "cpu", torch.float32)
    return module.state_dict()


def encode_batch(
    task: CountdownTask,
    pairs: list[tuple[CountdownProblem, str]],
    gen_length: int,
    longest: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded rows ``prompt + response`` with their attention mask, and where responses start. The
    response is the worked answer, ``<|eot_id|>``, then ``<|endoftext|>`` to the row's length: ``gen_length``,
    or (``longest`` set: canvases of varied lengths, what a length policy meets) a length drawn uniformly
    from the answer's own up to ``longest``, the columns after it absent (no attention, no loss)."""
    tokenizer = task._tokenizer
    prompts = [task.encode(task.prompt(p)) for p, _ in pairs]
    width = max(len(p) for p in prompts)
    answers = [tokenizer(answer, add_special_tokens=False)["input_ids"] + [EOT_ID] for _, answer in pairs]
    for (_, answer), response in zip(pairs, answers):
        if len(response) > (longest or gen_length):
            raise ValueError(f"answer {answer!r} is {len(response)} tokens, longer than gen_length={gen_length}")
    if longest is None:
        lengths = [gen_length] * len(pairs)
    else:
        assert rng is not None, "varied lengths are drawn from the run's generator"
        lengths = [int(rng.integers(len(response), longest + 1)) for response in answers]
    region = max(lengths)
    rows, masks = [], []
    for prompt, response, length in zip(prompts, answers, lengths):
        response = response + [EOS_ID] * (region - len(response))
        pad = width - len(prompt)
        rows.append([EOS_ID] * pad + prompt.tolist() + response)
        masks.append([False] * pad + [True] * (len(prompt) + length) + [False] * (region - length))
    return torch.tensor(rows), torch.tensor(masks), width


def sft_loss(
    model: BidirectionalTransformer,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, float]:
    """LLaDA's SFT loss on the response columns ``start:`` and the plain masked-token cross-entropy."""
    rows, length = tokens.shape
    eps = 1e-3
    rate = (1 - eps) * torch.rand(rows, 1, generator=generator) + eps
    masked = torch.zeros(rows, length, dtype=torch.bool)
    masked[:, start:] = torch.rand(rows, length - start, generator=generator) < rate
    masked &= attention  # a shorter canvas's absent columns are neither masked nor scored
    logits = model(torch.where(masked, MASK_ID, tokens), attention_mask=attention, logits_from=start)
    chosen = masked[:, start:]
    losses = torch.nn.functional.cross_entropy(logits[chosen], tokens[:, start:][chosen], reduction="none")
    # each row's loss over its own response length (LLaDA's SFT normalisation; one length: the whole region)
    per_column = (1.0 / (rate * attention[:, start:].sum(dim=1, keepdim=True))).expand(rows, length - start)
    return (losses * per_column[chosen]).sum() / rows, losses.mean().item()


def countdown_task(directory: Path, cfg: DictConfig, tier: str, block_length: int) -> CountdownTask:
    return CountdownTask(
        tokenizer=str(directory),
        mask_id=MASK_ID,
        vocab_size=VOCAB_SIZE,
        stop_ids=(EOS_ID, EOT_ID),
        chat=True,
        gen_length=cfg.gen_length,
        block_length=block_length,
        template=cfg.template,
        tier=tier,
    )


@hydra.main(version_base=None, config_path="conf/train", config_name="countdown")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    model_dir = out / "model"
    write_countdown_tokenizer(model_dir)
    task = countdown_task(model_dir, cfg, cfg.eval_tier, cfg.gen_length)
    eval_items = task.items()
    rng = np.random.default_rng(cfg.seed)
    sampler = ProblemSampler(cfg.curriculum, rng, held_out_triples())
    m = cfg.model
    model = BidirectionalTransformer(
        TransformerConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=m.d_model,
            num_layers=m.n_layers,
            num_heads=m.n_heads,
            num_kv_heads=m.n_heads,
            intermediate_size=m.mlp_hidden_size,
            max_length=m.max_sequence_length,
            rope_theta=500000.0,
            tie_embeddings=False,
        )
    )
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2:
            torch.nn.init.normal_(parameter, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpoints = Checkpointer(out, model, optimizer, generator, rng)
    checkpoints.start_from(cfg.init_from, lambda directory: native_weights(directory, "llada"))

    def batch_loss(done: float) -> tuple[torch.Tensor, dict[str, float]]:
        pairs = [sampler.draw(done) for _ in range(cfg.batch_size)]
        tokens, attention, start = encode_batch(task, pairs, cfg.gen_length, cfg.get("vary_length"), rng)
        loss, plain = sft_loss(model, tokens, attention, start, generator)
        return loss, {"masked_ce": plain}

    def on_checkpoint(step: int, seconds: float, done: float) -> dict:
        save_llada(model_dir, model, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
        write_trained_on(
            model_dir,
            template=cfg.template,
            gen_length=cfg.gen_length,
            block_length=cfg.decode_block_length,
            tier="small",
            token_frequencies="token_frequencies.json",
        )
        adapter = ModelAdapter(module=model, mask_id=MASK_ID, vocab_size=VOCAB_SIZE, max_length=m.max_sequence_length)
        measured = [
            checkpoint_accuracy(adapter, task, eval_items, decoder, ("task=countdown",))
            for decoder in cfg.eval_decoders
        ]
        tqdm.write(f"checkpoint step {step}: " + ", ".join(f"{e['decoder']} {e['accuracy']:.3f}" for e in measured))
        return {"numbers_up_to": sampler.high(done), "eval_tier": cfg.eval_tier, "eval": measured}

    TrainingLoop(cfg, checkpoints).run(batch_loss, on_checkpoint)


if __name__ == "__main__":
    main()
