"""Merge a LoRA adapter saved by a ``use_peft: true`` run into its base model, for evaluation or serving.

    python -m video_grpo.merge_lora --adapter_dir outputs/run --output_dir outputs/run-merged

The base model is the one named in the adapter's ``adapter_config.json`` (``--base_model`` overrides it).
The merged weights are written as safetensors, with the run's processor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def merge(adapter_dir: str | Path, output_dir: str | Path, base_model: str | None = None) -> Path:
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    config_file = adapter_dir / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{config_file} not found: is {adapter_dir} the output_dir of a use_peft run?"
        )
    base_model = base_model or json.loads(config_file.read_text())["base_model_name_or_path"]
    base = AutoModelForImageTextToText.from_pretrained(base_model, dtype="auto")
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(output_dir, safe_serialization=True)
    processor_source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_model
    AutoProcessor.from_pretrained(processor_source).save_pretrained(output_dir)
    return output_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapter_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--base_model")
    args = parser.parse_args(argv)
    print(f"merged model written to {merge(args.adapter_dir, args.output_dir, args.base_model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
