"""``python -m video_grpo.data check``: the data check's entry point (:mod:`video_grpo.data.check`)."""

import sys

from video_grpo.data.check import main

sys.exit(main())
