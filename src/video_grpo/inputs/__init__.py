"""What the model is fed: the prompt, frames and metadata turned into model inputs for each family
(``families``, ``processing``, ``positions``), the vision tower run once per video (``encoder``) and a group's
rows packed behind one shared prompt (``prefix``), with Qwen3.5's recurrent state forked to each answer
(``state_fork``)."""
