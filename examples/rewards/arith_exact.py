"""A reward function in a file; a workload in examples/workloads names it as
`reward_function = "../rewards/arith_exact.py:compute_score"`.

verl's signature. The exact answer is the response's last number (as verl's
GSM8K "flexible" rule reads it): 1.0 when it equals the ground truth, else 0.0;
whether the response is the number alone is returned as a dict entry that
placeflow logs as `reward_extra/number_only`.
"""

import re

NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = NUMBER.findall(solution_str)
    return {
        "score": 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0,
        "number_only": float(solution_str.strip() == str(ground_truth).strip()),
    }
