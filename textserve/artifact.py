"""The artifact contract of one model version: models/<name>/<version>/manifest.json.

Lean on purpose (stdlib only): the exporter writes it and the server reads it, and
the server must not need torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "logits"
# The largest version number: versions are int64 in the protocols (textserve.v1, metrics labels).
MAX_VERSION = 2**63 - 1


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, incomplete or does not match its files."""


@dataclass(frozen=True)
class Manifest:
    name: str  # model name, the directory above the version
    version: int  # positive integer, the version directory's name
    labels: list[str]  # label names in logit index order
    max_length: int  # longest input (tokens) the model was built for
    pad_token_id: int  # id used to pad input_ids (attention_mask is 0 there)
    opset: int  # ONNX opset of model.onnx
    precision: str  # fp32 | fp16 | int8
    sha256: dict[str, str]  # file name -> sha256 hex of model.onnx and tokenizer.json
    source_checkpoint_sha256: str  # sha256 of the run's model.safetensors
    parity: dict[str, float]  # max_abs_logit_diff, argmax_agreement, tolerance
    test_accuracy: float  # accuracy of model.onnx on the run's test split
    created_at: str  # ISO 8601, UTC
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # free-form (optimization, quantization...)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        required = [f for f in cls.__dataclass_fields__ if f not in ("format_version", "extra")]
        missing = [f for f in required if f not in data]
        if missing:
            raise ManifestError(f"manifest is missing field(s): {', '.join(missing)}")
        try:
            manifest = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from None
        manifest.check()
        return manifest

    @classmethod
    def read(cls, version_dir: Path) -> Manifest:
        path = Path(version_dir) / MANIFEST_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ManifestError(f"{path} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path} is unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{path} is not a JSON object")
        return cls.from_dict(data)

    def write(self, version_dir: Path) -> None:
        (Path(version_dir) / MANIFEST_FILE).write_text(self.to_json(), encoding="utf-8")

    def check(self) -> None:
        if not isinstance(self.version, int) or self.version < 1:
            raise ManifestError(f"version must be a positive integer, got {self.version!r}")
        if not self.labels or len(set(self.labels)) != len(self.labels):
            raise ManifestError("labels must be a non-empty list of distinct names")
        if self.precision not in PRECISIONS:
            raise ManifestError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ManifestError(f"max_length must be a positive integer, got {self.max_length!r}")
        for fname in (MODEL_FILE, TOKENIZER_FILE):
            if fname not in self.sha256:
                raise ManifestError(f"manifest has no sha256 for {fname}")

    def verify_files(self, version_dir: Path) -> None:
        """Raise ManifestError unless every file's sha256 matches the manifest."""
        for fname, expected in self.sha256.items():
            path = Path(version_dir) / fname
            if not path.is_file():
                raise ManifestError(f"{path} is missing")
            actual = sha256_file(path)
            if actual != expected:
                raise ManifestError(
                    f"{fname} sha256 {actual[:12]}… does not match the manifest's {expected[:12]}…"
                )


def canonical_version(text: str) -> int | None:
    """The version number `text` writes, if it writes one the one canonical way: ASCII digits,
    no sign, space or leading zero, within 1..MAX_VERSION; else None. `str.isdigit()` is not
    enough: it is true of "²" and other Unicode digits that int() refuses or reads differently.

    >>> [canonical_version(t) for t in ("1", "42", "01", "0", "²", "+1", " 1", "", "1" * 20)]
    [1, 42, None, None, None, None, None, None, None]
    """
    if not text or len(text) > len(str(MAX_VERSION)) or text[0] == "0":
        return None
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= MAX_VERSION else None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def disabled_optimizers(requested: Sequence[str]) -> list[str]:
    """onnxruntime graph optimizers to leave out of a session on these providers: part of the
    contract, because the export's checks must run a graph exactly as the server will.

    CPU only: SkipLayerNormFusion. onnxruntime's CPU SkipLayerNormalization kernel runs ~5x
    slower than the Add + LayerNormalization it replaces (onnxruntime 1.32: 0.8 vs 0.15 ms at
    800 tokens x 128, the same ratio at 256 and 768 wide); the int8 graph gets two of them
    (7-10% of a batch of 32). Sessions with CUDA keep the fusion: it was not measured there, and
    onnxruntime's transformer optimizations target that kernel on GPUs.

    >>> disabled_optimizers(["CPUExecutionProvider"])
    ['SkipLayerNormFusion']
    >>> disabled_optimizers(["CUDAExecutionProvider", "CPUExecutionProvider"])
    []
    """
    return ["SkipLayerNormFusion"] if list(requested) == ["CPUExecutionProvider"] else []
