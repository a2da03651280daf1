"""lm-eval's per-document scoring for the local Countdown task: dlmsearch's own judge."""

from dlmsearch.tasks.arithmetic import extract_equation
from dlmsearch.tasks.countdown import CountdownProblem, check_equation


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    problem = CountdownProblem(numbers=tuple(doc["nums"]), target=int(doc["target"]))
    return {"solved": float(check_equation(extract_equation(results[0]), problem).correct)}
