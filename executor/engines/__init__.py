"""Engines: the models a worker runs for its roles (rollout, training, scoring).

`transformer` is the one Llama/Qwen2 implementation (TP-aware, KV cache) in the
canonical parameter form of `placeflow.reshard_plan`; `sampler` generates with
it, `trainer` trains it (FSDP2 or DDP over DP, TP inside); `hf` converts
Hugging Face checkpoints; `vllm_adapter` puts vLLM behind the rollout interface.
"""
