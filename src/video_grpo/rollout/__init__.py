"""How a rollout runs: one prefill per prompt (``prefill``), a static cache filled from it (``static_cache``), and the
compiled decode step (``decode``)."""
