"""The GRPO objective as small pure functions (``grpo_math``) and ground-truth-guided groups with TempSamp's
advantage shaping (``guidance``). The trainer leaves TRL's loss as it is; these state it so it can be checked."""
