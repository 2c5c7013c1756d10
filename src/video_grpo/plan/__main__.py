"""``python -m video_grpo.plan``: see :mod:`video_grpo.plan.cli`."""

import sys

from video_grpo.plan.cli import main

sys.exit(main())
