"""The run's own machinery: how a launch describes itself and ends (``launch_env``, ``distributed``), checkpoints
to resume from, one input-gradient hook under gradient checkpointing, and the plan check's meters
(``memory_check``, ``memory_meters``, ``live_memory``)."""
