"""Engines: the models a worker runs for its roles (rollout, training, scoring).

`transformer` is the one Llama/Qwen2 implementation (TP-aware, one pipeline
stage, KV cache) in the canonical parameter form of `placeflow.reshard_plan`;
`sampler` generates with it, `trainer` trains it (FSDP2 or ZeRO over DP, TP
inside), `pipeline` runs its stages (1F1B, forward-only); `hf` converts
Hugging Face checkpoints; `vllm_adapter` puts vLLM behind the rollout interface.
"""
