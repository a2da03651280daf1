"""The Sudoku task: puzzles as canvases, the solved-grid check, and board rendering.

Cells are tokens ``digit - 1`` (0..8); the mask token is 9. Clues sit in the canvas as
committed tokens, blanks as masks, and there is no prompt: the whole 81-cell grid is one
block. Decoder defaults that suit Sudoku (frontier = every masked cell, a high threshold)
live in ``conf/decoding/sudoku.yaml``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import numpy as np
import torch

from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.sudoku_files import TIERS, SudokuPuzzle, load_puzzles, tier_path
from dlmsearch.tasks.sudoku_grids import CELLS, format_board, grid_to_string, is_solved
from dlmsearch.validation import check_choice, check_type

SUDOKU_VOCAB = 10
SUDOKU_MASK_ID = 9


def grids_to_tokens(grids: np.ndarray) -> torch.Tensor:
    """Grids ``[n, 81]`` (0 = blank) to token ids with blanks as the mask token."""
    grids = torch.as_tensor(np.asarray(grids, dtype=np.int64))
    return torch.where(grids == 0, SUDOKU_MASK_ID, grids - 1)


def tokens_to_grids(tokens: torch.Tensor) -> np.ndarray:
    """Token ids back to digits; masked cells become 0."""
    tokens = tokens.detach().cpu().long()
    return torch.where(tokens == SUDOKU_MASK_ID, 0, tokens + 1).numpy().astype(np.int8)


def puzzle_item(puzzle: SudokuPuzzle) -> TaskItem:
    """A puzzle as a canvas: no prompt, clues as fixed tokens, blanks masked."""
    generation = grids_to_tokens(puzzle.puzzle[None])[0]
    return TaskItem(
        id=puzzle.id,
        prompt=torch.zeros(0, dtype=torch.long),
        generation=generation,
        reference=puzzle,
        question=generation.clone(),
    )


def _units() -> torch.Tensor:
    """``[27, 9]`` cell indices of the rows, columns and boxes."""
    cells = torch.arange(CELLS).view(9, 9)
    boxes = cells.view(3, 3, 3, 3).permute(0, 2, 1, 3).reshape(9, 9)
    return torch.cat([cells, cells.T, boxes])


UNITS = _units()


@attrs.frozen
class SudokuVerifier:
    """The rules: no digit twice in a row, column or box, and the clues kept. A grid that breaks
    them can never be completed into a solution; a full grid that keeps them is one."""

    clues: torch.Tensor  # [samples, 81] the puzzles as canvases (mask where blank)
    checks_partial: ClassVar[bool] = True
    checks_complete: ClassVar[bool] = True  # accepts() judges a complete output

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        filled = ~masked & (tokens != SUDOKU_MASK_ID)
        digits = torch.nn.functional.one_hot(torch.where(filled, tokens, 0), SUDOKU_MASK_ID) * filled[..., None]
        clashes = digits[:, UNITS].sum(dim=2).amax(dim=(1, 2)) > 1
        clues = self.clues[sample]
        kept = ((clues == SUDOKU_MASK_ID) | (clues == tokens)).all(dim=1)
        return ~clashes & kept

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        complete = (tokens != SUDOKU_MASK_ID).all(dim=1)
        return complete & self.consistent(sample, tokens, tokens == SUDOKU_MASK_ID)

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Each digit's repeats within each row, column and box (a digit three times in a row: 2), plus
        clues changed, plus cells left blank."""
        filled = tokens != SUDOKU_MASK_ID
        digits = torch.nn.functional.one_hot(torch.where(filled, tokens, 0), SUDOKU_MASK_ID) * filled[..., None]
        repeats = (digits[:, UNITS].sum(dim=2) - 1).clamp(min=0).sum(dim=(1, 2))
        clues = self.clues[sample]
        changed = ((clues != SUDOKU_MASK_ID) & (clues != tokens)).sum(dim=1)
        return (repeats + changed + (~filled).sum(dim=1)).float()

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        return [grid_to_string(tokens_to_grids(row)) for row in tokens]


@attrs.define
class SudokuTask:
    """Held-out puzzles (``tier``) or the user's own file (``path``), optionally the first ``limit``."""

    tier: str = attrs.field(default="easy", validator=check_choice(*TIERS))
    path: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    limit: int | None = attrs.field(default=None, validator=check_type(int, optional=True))
    gen_length: int = attrs.field(default=CELLS, validator=check_type(int))
    block_length: int = attrs.field(default=CELLS, validator=check_type(int))
    name: ClassVar[str] = "sudoku"

    def __attrs_post_init__(self) -> None:
        if self.gen_length != CELLS or self.block_length != CELLS:
            raise ValueError(
                f"a Sudoku canvas is one block of {CELLS} cells; got gen_length={self.gen_length}, block_length={self.block_length}"
            )
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"task.limit must be at least 1, got {self.limit}")

    @property
    def source(self) -> str:
        return self.path or f"{self.tier} tier"

    def puzzles(self) -> list[SudokuPuzzle]:
        puzzles = load_puzzles(self.path if self.path else tier_path(self.tier))
        return puzzles[: self.limit] if self.limit else puzzles

    def items(self) -> list[TaskItem]:
        return [puzzle_item(p) for p in self.puzzles()]

    def judge(self, item: TaskItem, tokens: torch.Tensor) -> bool:
        return is_solved(tokens_to_grids(tokens), item.reference.puzzle)

    def output(self, item: TaskItem, tokens: torch.Tensor) -> str:
        return grid_to_string(tokens_to_grids(tokens))

    def details(self, item: TaskItem, tokens: torch.Tensor) -> dict[str, Any]:
        return {}

    def verifier(self, questions: list[Any]) -> SudokuVerifier:
        """The rule check of the batch's puzzles (their clues, never their solutions)."""
        return SudokuVerifier(torch.stack(questions))

    def token_strings(self, ids: list[int]) -> list[str]:
        """Digits as written ("1".."9"); the mask as "_"."""
        return ["_" if int(t) == SUDOKU_MASK_ID else str(int(t) + 1) for t in ids]

    def render(self, item: TaskItem, output: str) -> str:
        grid = np.array([int(c) for c in output], dtype=np.int8)
        left = format_board(item.reference.puzzle).splitlines()
        right = format_board(grid).splitlines()
        verdict = "solved" if is_solved(grid, item.reference.puzzle) else "NOT solved"
        header = f"{'puzzle ' + item.id:<24}   decoded ({verdict})"
        return "\n".join([header] + [f"{a:<24}   {b}" for a, b in zip(left, right)])
