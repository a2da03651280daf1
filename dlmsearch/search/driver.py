"""The search driver: the one decode loop that every decoder runs.

Each round, for every unfinished sample of the batch at once: evaluate the root state (unless
the previous round left a fresh evaluation), ask the trigger, and run a lookahead for the
exploring samples: candidates become hypotheses, all live hypotheses of all samples go through
the engine together level by level, the scorer rates them, the expansion policy decides whether
to roll deeper (with the selector's branch re-evaluation in between), and the selected branch
is adopted together with the evaluation it already has. Then every sample applies the base
commit rule to its state (explore, then exploit: an adopted branch's evaluation is used, never
recomputed), except where the selector asked for a fresh lookahead from the adopted state.
Baselines are this same loop with the trigger set to never.
"""

from __future__ import annotations

import time
from typing import Callable

import attrs
import torch

from dlmsearch.search.candidates import CandidateGenerator
from dlmsearch.search.commit import CommitRule
from dlmsearch.search.engine import Evaluation, RolloutEngine
from dlmsearch.search.expansion import ExpansionPolicy
from dlmsearch.search.scorers import Scorer
from dlmsearch.search.selectors import Selector
from dlmsearch.search.state import Canvas, Layout, initial_canvas
from dlmsearch.search.triggers import NeverTrigger, Trigger


@attrs.frozen
class DecodeRequest:
    """One sample: ``uid`` keys its randomness; ``generation`` holds the mask where to fill."""

    uid: int
    prompt: torch.Tensor
    generation: torch.Tensor


@attrs.frozen
class DecodeResult:
    """A decoded generation region and how it was produced (per-position commit record)."""

    uid: int
    tokens: torch.Tensor  # [n]
    steps: int
    row_forwards: int
    tokens_committed: int
    token_forwards: int  # positions the model computed for this sample (a cache's saving shows here)
    deadline_hit: bool  # the time budget ran out and the sample was finished by the base rule alone
    commit_call: torch.Tensor  # [n], -1 where the token was given
    commit_confidence: torch.Tensor
    commit_depth: torch.Tensor  # 0: base rule on the root; d >= 1: lookahead depth d
    commit_branch: torch.Tensor  # lookahead branch index, -1 for base commits


@attrs.define
class SearchDecoder:
    """Trigger, candidates, scorer, expansion and selector around a base commit rule."""

    commit: CommitRule
    trigger: Trigger = attrs.field(factory=NeverTrigger)
    candidates: CandidateGenerator | None = None
    scorer: Scorer | None = None
    expansion: ExpansionPolicy | None = None
    selector: Selector | None = None
    name: str = "custom"
    block_length: int | None = None  # a decoder with its own block structure (Dream: one block); None: the task's

    def __attrs_post_init__(self) -> None:
        if self.trigger.explores:
            missing = [n for n in ("candidates", "scorer", "expansion", "selector") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"decoder {self.name!r} explores (trigger {type(self.trigger).__name__}) but has no {', '.join(missing)}")

    def decode(
        self,
        engine: RolloutEngine,
        requests: list[DecodeRequest],
        block_length: int,
        on_round: Callable[[Canvas], None] | None = None,
        deadline_s: float | None = None,
    ) -> list[DecodeResult]:
        """Decode a batch; each sample's result is independent of the others in the batch.

        ``on_round`` sees the root canvas of all samples after every round (for traces and tests).
        Past ``deadline_s`` seconds, samples still decoding stop exploring and finish with the
        base commit rule alone (their results say so).
        """
        started = time.monotonic()
        if not requests:
            return []
        block_length = self.block_length or block_length
        gen_length = len(requests[0].generation)
        if any(len(r.generation) != gen_length for r in requests):
            raise ValueError("all requests of a batch must share one generation length")
        layout = Layout(gen_start=max(len(r.prompt) for r in requests), gen_length=gen_length, block_length=block_length)
        longest = max(requests, key=lambda r: len(r.prompt))
        engine.adapter.check_length(len(longest.prompt) + gen_length, f"the canvas of sample uid {longest.uid} (prompt {len(longest.prompt)} + generation {gen_length})")
        bad = [r.uid for r in requests if bool(((r.prompt < 0) | (r.prompt >= engine.adapter.vocab_size)).any())]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {engine.adapter.vocab_size}) in sample uid(s) {bad}")
        self.commit.bind(layout)
        mask_id = engine.mask_id
        canvas = initial_canvas([r.prompt for r in requests], [r.generation for r in requests], layout, mask_id, pad_id=mask_id)
        samples = len(requests)
        engine.reset(samples)
        uid = torch.tensor([r.uid for r in requests], dtype=torch.long)
        cache = Evaluation.empty(samples, layout.width, self.commit.statistics)
        fresh = torch.zeros(samples, dtype=torch.bool)
        late = torch.zeros(samples, dtype=torch.bool)
        # Every round commits at least one position per sample, except the steps a fixed schedule
        # may leave empty (Dream's first steps): at most its budget per block.
        rounds = gen_length + 1 + (self.commit.block_budget or 0) * layout.num_blocks
        for _ in range(rounds):
            active = canvas.masked.any(dim=1)
            if not bool(active.any()):
                break
            need = (active & ~fresh).nonzero().squeeze(1)
            if need.numel():
                cache = cache.put(need, self._evaluate(engine, canvas.take(need), need, uid, torch.zeros_like(need), layout))
                fresh[need] = True
            rows = active.nonzero().squeeze(1)
            root, evaluation = canvas.take(rows), cache.take(rows)
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                late |= active
            explore = self.trigger.fires(root, evaluation, layout) & ~late[rows]
            exploit = ~explore
            explored = rows[explore]
            if explored.numel():
                # Explore: adopt the selected branch with the evaluation it already has. Unless
                # the selector asks for a fresh lookahead from it, exploit that evaluation at once.
                adopted, adopted_eval, restart = self._lookahead(engine, root.take(explore), evaluation.take(explore), explored, uid, layout)
                at = explore.nonzero().squeeze(1)  # positions of the exploring samples within ``rows``
                root, evaluation = root.put(at, adopted), evaluation.put(at, adopted_eval)
                canvas = canvas.put(explored, adopted)
                cache = cache.put(explored, adopted_eval)
                exploit = exploit.clone()
                exploit[at] = ~restart
            base = rows[exploit]
            if base.numel():
                sub, sub_eval = root.take(exploit), evaluation.take(exploit)
                chosen = self.commit.select(sub, sub_eval, layout)
                committed = sub.commit(chosen, sub_eval.token, sub_eval.confidence, engine.steps[base], 0, -1, layout, self.commit.block_budget)
                canvas = canvas.put(base, committed)
                fresh[base] = False
            if on_round is not None:
                on_round(canvas)
        else:
            raise RuntimeError(f"decoder {self.name!r} did not finish within {rounds} rounds")
        return [self._result(canvas, engine, i, int(uid[i]), layout, bool(late[i])) for i in range(samples)]

    def _evaluate(self, engine: RolloutEngine, canvas: Canvas, sample: torch.Tensor, uid: torch.Tensor, row_key: torch.Tensor, layout: Layout) -> Evaluation:
        return engine.evaluate(canvas.tokens, canvas.attention, sample, uid[sample], row_key, self.commit.statistics, layout.gen_start, canvas.window(layout))

    def _lookahead(
        self, engine: RolloutEngine, root: Canvas, evaluation: Evaluation, sample: torch.Tensor, uid: torch.Tensor, layout: Layout
    ) -> tuple[Canvas, Evaluation, torch.Tensor]:
        """Roll hypotheses of all exploring samples level by level.

        Returns the adopted branches, their evaluations, and ``[S]`` restart flags (the selector
        wants a fresh lookahead from the adopted state instead of exploiting it).
        """
        assert self.candidates and self.scorer and self.expansion and self.selector
        # A policy that decides from the root (ConfidenceDepth) is bound to these samples first.
        plan = getattr(self.expansion, "plan", None)
        expansion = plan(root, evaluation, layout) if plan is not None else self.expansion
        positions, live = self.candidates.propose(root, evaluation, layout)
        samples, width = positions.shape
        sample_row = sample.repeat_interleave(width)
        branch_id = torch.arange(width).repeat(samples)
        first = torch.zeros(samples * width, root.tokens.shape[1], dtype=torch.bool)
        first[torch.arange(samples * width), positions.flatten()] = True
        first &= live.flatten()[:, None]
        token = evaluation.token.repeat_interleave(width, dim=0)
        confidence = evaluation.confidence.repeat_interleave(width, dim=0)
        branches = root.repeat(width).commit(first, token, confidence, engine.steps[sample_row], 1, branch_id, layout, self.commit.block_budget)
        step_log_conf = torch.log(evaluation.confidence.gather(1, positions).clamp(min=1e-30)).flatten()
        scores = torch.zeros(samples * width)
        branch_eval = Evaluation.empty(samples * width, root.tokens.shape[1], self.commit.statistics)
        rolling = torch.ones(samples, dtype=torch.bool)
        restarted = torch.zeros(samples, dtype=torch.bool)
        depth = 1
        while True:
            rows = (live & rolling[:, None]).flatten().nonzero().squeeze(1)
            sub = branches.take(rows)
            sub_eval = self._evaluate(engine, sub, sample_row[rows], uid, 1 + branch_id[rows], layout)
            branch_eval = branch_eval.put(rows, sub_eval)
            gained = self.scorer.score(sub, sub_eval, layout, step_log_conf[rows])
            scores = scores.clone()
            scores[rows] = scores[rows] + gained if expansion.accumulate else gained
            if depth >= expansion.max_depth:
                break
            grid = scores.view(samples, width)
            finished = (~branches.masked.any(dim=1)).view(samples, width)
            go = rolling & expansion.should_continue(grid, live, depth) & ~(live & finished).any(dim=1)
            if self.selector.reevaluates and bool(go.any()):
                fires = torch.zeros(samples * width, dtype=torch.bool)
                fires[rows] = self.trigger.fires(sub, sub_eval, layout)
                pruned, restart = self.selector.prune(live, fires.view(samples, width), grid)
                live = torch.where(go[:, None], pruned, live)
                restarted |= go & restart
                go &= ~restart
            rolling = go
            if not bool(rolling.any()):
                break
            rows = (live & rolling[:, None]).flatten().nonzero().squeeze(1)
            sub, sub_eval = branches.take(rows), branch_eval.take(rows)
            chosen = self.commit.select(sub, sub_eval, layout) & sub.masked
            logs = torch.where(chosen, torch.log(sub_eval.confidence.clamp(min=1e-30)), 0.0).sum(dim=1)
            step_log_conf = step_log_conf.clone()
            step_log_conf[rows] = logs / chosen.sum(dim=1).clamp(min=1)
            depth += 1
            rolled = sub.commit(chosen, sub_eval.token, sub_eval.confidence, engine.steps[sample_row[rows]], depth, branch_id[rows], layout, self.commit.block_budget)
            branches = branches.put(rows, rolled)
        best = self.selector.best(scores.view(samples, width), live)
        adopted = torch.arange(samples) * width + best
        return branches.take(adopted), branch_eval.take(adopted), restarted

    def _result(self, canvas: Canvas, engine: RolloutEngine, row: int, uid: int, layout: Layout, late: bool) -> DecodeResult:
        gen = slice(layout.gen_start, layout.width)
        call = canvas.commit_call[row, gen]
        return DecodeResult(
            uid=uid,
            tokens=canvas.tokens[row, gen].clone(),
            steps=int(engine.steps[row]),
            row_forwards=int(engine.row_forwards[row]),
            token_forwards=int(engine.token_forwards[row]),
            deadline_hit=late,
            tokens_committed=int((call >= 0).sum()),
            commit_call=call.clone(),
            commit_confidence=canvas.commit_confidence[row, gen].clone(),
            commit_depth=canvas.commit_depth[row, gen].clone(),
            commit_branch=canvas.commit_branch[row, gen].clone(),
        )
