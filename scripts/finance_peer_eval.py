"""Runs FinQA's or TAT-QA's own evaluator (their code, from a fetched checkout, in its own
venv: scripts/finance-peer-venv.sh) on the cases scripts/finance_agreement.py sends.

Usage: python finance_peer_eval.py finqa|tatqa CHECKOUT < cases.json > verdicts.json
finqa: cases [{program, table}] -> [result]: `eval_program` of code/evaluate/evaluate.py
(invalid: null). tatqa: cases [{question, prediction, scale}] -> [em]: `TaTQAEmAndF1`.
"""

import json
import sys


def main() -> None:
    which, checkout = sys.argv[1], sys.argv[2]
    cases = json.load(sys.stdin)
    out = []
    if which == "finqa":
        sys.path.insert(0, f"{checkout}/code/evaluate")
        import evaluate  # their module

        for case in cases:
            tokens = evaluate.program_tokenization(case["program"])
            invalid, result = evaluate.eval_program(tokens, case["table"])
            out.append(None if invalid else result)
    else:
        sys.path.insert(0, checkout)
        from tatqa_metric import TaTQAEmAndF1  # their module

        for case in cases:
            metric = TaTQAEmAndF1()
            metric(case["question"], case["prediction"], case["scale"])
            out.append(metric.get_overall_metric()[0])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
