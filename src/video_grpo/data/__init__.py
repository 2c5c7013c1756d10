"""Where a sample comes from: annotation formats and sources, the dataset whose rows decode their video on
access, reading and sampling video, the frame cache, and the draws (TimeLens's difficulty draw, TimeLens2's
weights). ``python -m video_grpo.data check`` checks a recipe's data (:mod:`~video_grpo.data.check`)."""
