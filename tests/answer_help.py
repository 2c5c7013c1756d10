"""Run ``python -m MODULE --help`` for each module named on the command line, one after another in this one
interpreter (``runpy``, as ``-m`` runs a module), and print one JSON line: module -> its exit code, what it printed,
and the end of its error output. tests/test_docs.py runs it once in a fresh process: torch and transformers are
imported once for all the modules, not once per module.

    python tests/answer_help.py video_grpo.plan video_grpo.grpo ...
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback


def answer_help(module: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    code: int | str = 0
    saved_argv = sys.argv
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 (a module that fails is reported, and the others still run)
        code = "raised"
        err.write(traceback.format_exc())
    finally:
        sys.argv = saved_argv
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-500:]}


if __name__ == "__main__":
    real_stdout = sys.stdout
    results = {module: answer_help(module) for module in sys.argv[1:]}
    print(json.dumps(results), file=real_stdout)
