"""A reward function in a file; a workload in examples/workloads names it as
`reward_function = "../rewards/arith_exact.py:compute_score"`.

verl's signature; 1.0 for exactly the sum (the first line of the response,
spaces ignored), else 0.0 — with the answer's format credited as a dict entry
that placeflow logs as `reward_extra/digits_only`.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = solution_str.strip().split("\n")[0].strip()
    return {
        "score": 1.0 if first == ground_truth else 0.0,
        "digits_only": float(first.isdigit()),
    }
