"""placeflow.executor: the Ray single-controller executor (DESIGN.md, Executor).

One concept per module; import the module you need (only balance, batch,
dispatch and groups are free of Ray):

- balance:    per-sample work a·s + s² and token-aware DP partitions (Karmarkar–Karp)
- batch:      Batch, named tensors plus per-sample metadata
- dispatch:   broadcast, split_by_dp, collect: who gets which shard, results in order
- groups:     the worker groups a plan has, and their rank layouts
- pools:      one Ray placement group per device set; the resource check
- worker:     the Ray actor on one device, holding every role placed there
- calls:      waiting for remote calls with a deadline; failures named by role and rank
- controller: plan -> pools -> workers -> process groups; shutdown
- errors:     WorkerError and the other run-time failures
"""
