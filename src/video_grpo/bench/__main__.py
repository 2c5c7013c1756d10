"""``python -m video_grpo.bench perf|learning``."""

import sys

from video_grpo.bench.perf import main

sys.exit(main())
