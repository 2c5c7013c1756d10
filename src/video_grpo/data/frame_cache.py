"""The frame cache: a video's sampled frames stored once (by ``python -m video_grpo.preprocess``) and read by
training instead of decoding the video again.

Two formats, chosen with ``frame_cache_format``:

- ``jpeg`` (default): every frame a JPEG at :data:`JPEG_QUALITY` with full-resolution colour (4:4:4), encoded
  by Pillow and decoded by torchvision's libjpeg-turbo ``decode_jpeg``. About 1/12 the size of ``raw``; the
  frames differ from the decoded ones by about 40 dB PSNR (a mean error near 1 of 255 levels, sharpest at
  hard colour edges). Colour is kept at full resolution because the usual 4:2:0 subsampling costs far more
  than quantisation: at quality 95 it stays near 27 dB on the benchmark clip.
- ``raw``: the uint8 frames as they were decoded: exact, about 45x the mp4's size (15.8 MB for 60 frames of
  392x224).

An entry lives at ``<cache_dir>/<key[:2]>/<key><suffix>``; the key hashes the video's path, size and mtime and
every sampling setting, so a changed file or setting never reuses stale frames. ``raw`` entries keep the key
and name (``<key>.safetensors``) of earlier versions, which stay readable; ``jpeg`` entries add the format to
the key and are named ``<key>.jpeg.safetensors``, so both formats of one video and sampling coexist. A
``jpeg`` reader takes a ``raw`` entry when it finds no ``jpeg`` one (exact frames are better, and a cache
written before ``jpeg`` existed keeps serving); a ``raw`` reader never takes a ``jpeg`` entry, since asking
for ``raw`` means asking for exact frames.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from video_grpo.data.video import SampledVideo, SamplingConfig, read_video

logger = logging.getLogger(__name__)
# torchvision 0.29 warns on every decode_jpeg call that its codecs are deprecated (in favour of TorchCodec, not
# installed here); the version is pinned, so the warning says nothing a user can act on.
warnings.filterwarnings(
    "ignore", message="The image decoding and encoding capabilities of TorchVision are deprecated"
)

CACHE_FORMATS = ("jpeg", "raw")
DEFAULT_CACHE_FORMAT = "jpeg"
JPEG_QUALITY = (
    90  # 40 dB PSNR and 1/12 of raw on the benchmark clip; 95 gives 45 dB at 1/9, 80 gives 36 dB at 1/16
)
CACHE_FORMAT_VERSION = 2  # 2: frames chosen by timestamp, metadata has "timestamps"
SUFFIXES = {"raw": ".safetensors", "jpeg": ".jpeg.safetensors"}


def check_format(fmt: str) -> str:
    """``fmt`` if it is a cache format, else a ValueError naming the choices."""
    if fmt not in CACHE_FORMATS:
        raise ValueError(
            f"frame_cache_format: unknown format {fmt!r}; choose one of {list(CACHE_FORMATS)} "
            "(jpeg: about 1/12 the size, ~40 dB PSNR; raw: exact frames)."
        )
    return fmt


def cache_key(path: str, cfg: SamplingConfig, fmt: str = DEFAULT_CACHE_FORMAT) -> str:
    """Changes whenever the file (path, size, mtime), any sampling setting or the format changes.

    ``raw`` hashes exactly what earlier versions hashed, so their entries are still found."""
    stat = os.stat(path)
    identity = {
        "path": os.path.abspath(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sampling": asdict(cfg),
        "version": CACHE_FORMAT_VERSION,
    }
    if check_format(fmt) != "raw":
        identity["format"] = fmt
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def cache_path(
    cache_dir: str | Path, path: str, cfg: SamplingConfig, fmt: str = DEFAULT_CACHE_FORMAT
) -> Path:
    key = cache_key(path, cfg, fmt)
    return Path(cache_dir) / key[:2] / f"{key}{SUFFIXES[fmt]}"


def encode_frames(frames: torch.Tensor, quality: int = JPEG_QUALITY) -> list[bytes]:
    """(T, C, H, W) uint8 RGB frames as JPEG files, colour at full resolution (Pillow's ``subsampling=0``):
    torchvision's ``encode_jpeg`` always halves the colour resolution, which the benchmark clip's sharp
    colour edges turn into a 27 dB ceiling whatever the quality."""
    from PIL import Image

    encoded = []
    # One (T, H, W, C) copy for all frames: a copy per frame costs milliseconds each in torch's thread pool
    for frame in frames.permute(0, 2, 3, 1).contiguous().numpy():
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=quality, subsampling=0)
        encoded.append(buffer.getvalue())
    return encoded


def decode_frames(data: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The (T, C, H, W) uint8 frames back from JPEG files stored end to end in ``data``, frame k at
    ``data[offsets[k]:offsets[k + 1]]``.

    torchvision's libjpeg-turbo decoder, about 1.5x faster here than Pillow's (which would do if torchvision,
    pinned at 0.29.1, drops its deprecated image codecs)."""
    import numpy as np
    from torchvision.io import ImageReadMode, decode_jpeg

    bounds = offsets.tolist()
    decoded = [
        decode_jpeg(data[a:b], mode=ImageReadMode.RGB).numpy()
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    # numpy's single-threaded copy: torch.stack's thread pool took 10-300 ms for these 16 MB on a busy 2-core machine
    return torch.from_numpy(np.stack(decoded))


def entry_tensors(video: SampledVideo, fmt: str, quality: int = JPEG_QUALITY) -> tuple[dict, dict]:
    """What an entry stores: safetensors tensors and string metadata."""
    metadata = {"video_metadata": json.dumps(video.metadata), "format": fmt}
    if check_format(fmt) == "raw":
        return {"frames": video.frames.contiguous()}, metadata
    files = encode_frames(video.frames, quality)
    offsets = torch.tensor([0, *torch.tensor([len(f) for f in files]).cumsum(0).tolist()], dtype=torch.int64)
    data = torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
    return {"jpeg": data, "offsets": offsets}, {**metadata, "quality": str(quality)}


def entry_size(video: SampledVideo, fmt: str, quality: int = JPEG_QUALITY) -> int:
    """Bytes an entry for ``video`` takes on disk, without writing it (for preprocess's estimate)."""
    from safetensors.torch import save

    return len(save(*entry_tensors(video, fmt, quality)))


def write_cache(
    cache_dir: str | Path,
    path: str,
    cfg: SamplingConfig,
    video: SampledVideo,
    fmt: str = DEFAULT_CACHE_FORMAT,
    quality: int = JPEG_QUALITY,
) -> Path:
    """Store sampled frames atomically: a killed writer leaves a temp file, never a half entry."""
    from safetensors.torch import save_file

    target = cache_path(cache_dir, path, cfg, fmt)
    tensors, metadata = entry_tensors(video, fmt, quality)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def read_entry(entry: str | Path) -> SampledVideo:
    """One entry file, either format, as frames and metadata."""
    from safetensors import safe_open

    with safe_open(str(entry), framework="pt") as f:
        header = f.metadata()
        metadata = json.loads(header["video_metadata"])
        if header.get("format", "raw") == "jpeg":
            return SampledVideo(
                frames=decode_frames(f.get_tensor("jpeg"), f.get_tensor("offsets")), metadata=metadata
            )
        return SampledVideo(frames=f.get_tensor("frames"), metadata=metadata)


def read_cached(
    cache_dir: str | Path, path: str, cfg: SamplingConfig, fmt: str = DEFAULT_CACHE_FORMAT
) -> SampledVideo | None:
    """The cached sample for this file and sampling, or None. A ``jpeg`` reader also takes a ``raw`` entry.

    An unreadable entry (truncated by a full disk, say) is logged and skipped: the video is decoded instead."""
    for candidate in (fmt, "raw") if check_format(fmt) == "jpeg" else ("raw",):
        try:
            target = cache_path(cache_dir, path, cfg, candidate)
        except OSError:
            return None  # the video itself is gone; decoding will report it
        if not target.is_file():
            continue
        try:
            return read_entry(target)
        except Exception as err:  # safetensors and libjpeg raise assorted errors on damaged files
            logger.warning(
                f"frame cache entry {target} for {path} is unreadable ({type(err).__name__}: {err}); "
                "decoding the video instead. Delete the entry and rerun preprocess to rewrite it."
            )
    return None


def load_video(
    path: str,
    cfg: SamplingConfig,
    cache_dir: str | Path | None = None,
    cache_format: str = DEFAULT_CACHE_FORMAT,
) -> SampledVideo:
    """Frames from the cache when present, else decoded."""
    if cache_dir:
        cached = read_cached(cache_dir, path, cfg, cache_format)
        if cached is not None:
            return cached
    return read_video(path, cfg)


def psnr(frames: torch.Tensor, reference: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB of uint8 ``frames`` against ``reference`` (inf when identical)."""
    diff = frames.to(torch.int32) - reference.to(torch.int32)
    mse = (diff * diff).sum().item() / diff.numel()  # exact integer sum; 10x faster than in float64
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
