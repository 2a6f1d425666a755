"""Engine adapters: one module per engine, each imported on its own
(``from prefill_handoff.engines import trtllm``). None imports its engine."""
