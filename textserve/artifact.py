"""The artifact contract of one model version: models/<name>/<version>/manifest.json.

Lean on purpose (stdlib and jsonschema only): the exporter writes it and the server reads it,
and the server must not need torch. Everything in a repository is untrusted input (a CI job, a
shared volume, a mistaken `cp` can put anything there), so this module is also where a version
is read safely:

    version = parse_version("12")                  # 12; None for "012", "²", "99999999999999999999"
    for version, path in iter_versions(Path("models/m")): ...    # every version folder, ascending
    manifest, files = read_version(Path("models/m/12"))   # files: {"model.onnx": b"...", ...}
    manifest, files, model = open_version(Path("models/m/12"))  # model.onnx open, not read

`read_version` hands back the very bytes it hashed, so what is verified is what is loaded.
`open_version` (the server's) hashes model.onnx while streaming it and hands back the open file:
onnxruntime reads it through that descriptor, and `model.unchanged()` refuses a file written to
since, so a multi-GiB model is never held twice (once in Python, once in onnxruntime).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from textserve.nli import zero_shot_problem

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
CONTRACT_FILES = (MODEL_FILE, TOKENIZER_FILE)  # the only files a manifest may reference
FORMAT_VERSION = 2  # what is written; format 1 stays readable (missing fields: the defaults)
FORMAT_VERSIONS = (1, 2)
PRECISIONS = ("fp32", "fp16", "int8")
INPUT_NAMES = ("input_ids", "attention_mask")  # every graph takes these
OUTPUT_NAME = "logits"
SOURCE_KINDS = ("textserve", "huggingface", "module")
# softmax: single-label; sigmoid: multi-label (each label on its own); none: regression.
ACTIVATIONS = ("softmax", "sigmoid", "none")
TRUNCATION_SIDES = ("right", "left")
DEFAULT_THRESHOLD = 0.5  # a sigmoid label passes at this score unless manifest/request say else
# unk_token_id in memory when the manifest has none (format 1, or a v2 one without the key):
# the id of the tokenizer's "[UNK]", format 1's rule. Never written: to_json leaves it out.
UNK_BY_NAME = -1
# Fields format 2 added: a format 1 manifest that has one is refused (it would be misread).
V2_FIELDS = (
    "source", "inputs", "activation", "threshold", "unk_token_id", "truncation_side", "task",
    "tagging", "zero_shot",
)  # fmt: skip
SEQUENCE_CLASSIFICATION = "sequence-classification"  # one row of logits per text
TOKEN_CLASSIFICATION = "token-classification"  # one row per token: entities (tagging.py)

# Versions go out as int64 (protobuf, Prometheus labels): a bigger one made every RPC fail.
MAX_VERSION = 2**63 - 1
# Size caps, checked before a byte is read: generous for real models (the largest we export is
# ~0.5 GB), but a version can no longer make the server hash or hold a 40 GB file.
MAX_FILE_BYTES = {
    MANIFEST_FILE: 1 << 20,
    MODEL_FILE: 4 << 30,
    TOKENIZER_FILE: 256 << 20,
}
# Nesting a manifest may have (ours: 4). Deeper JSON is refused before the schema sees it: it
# would otherwise reach the recursion limit in json, jsonschema or dataclasses.asdict.
MAX_DEPTH = 32
SCHEMA_RESOURCE = ("schemas", "manifest.schema.json")  # inside the textserve package


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, incomplete or does not match its files."""


class MissingFileError(ManifestError):
    """A file of the contract is not in the version directory."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


class UnsafeFileError(ManifestError):
    """A file that may not be read: a symbolic link, not a regular file, over its size cap."""


class ChecksumError(ManifestError):
    """A file whose sha256 is not the manifest's."""


def shown(name: str, limit: int = 64) -> str:
    """An untrusted name (a folder's, or a request's model name or version) for a message or a
    log line: quoted and escaped as !r would, cut to `limit` characters with the full length
    said. Never the megabytes a client may send: a 3 MB model name once made a 3 MB log line and
    a status message too big for grpc's metadata, so the client saw that instead of NOT_FOUND.

    >>> shown("²"), shown("x" * 100, limit=3)
    ("'²'", "'xxx…' (100 characters)")
    """
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit] + '…'!r} ({len(name)} characters)"


def parse_version(name: str) -> int | None:
    """The version a directory name stands for, or None: a canonical ASCII decimal (no sign, no
    leading zero, nothing but 0-9; str.isdigit() also takes '²') within 1..2**63-1.

    >>> [parse_version(n) for n in ("1", "12", "0", "012", "+1", "²", "1 ", str(2**63))]
    [1, 12, None, None, None, None, None, None]
    """
    # The length test first: int() of a long string is quadratic, and it bounds the range check.
    if not 0 < len(name) <= 19 or not name.isascii() or not name.isdigit() or name[0] == "0":
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


def iter_versions(
    model_dir: Path, *, complete: bool = False, skipped: set[str] | None = None
) -> Iterator[tuple[int, Path]]:
    """(version, path) of each version folder of models/<name>/ (`model_dir`), ascending: the
    one rule every reader of a repository uses (the server's scan, the worker sizing, the
    export's numbering, `textserve models`, bench). An entry is a version when parse_version
    takes its name and it is a directory, or a symbolic link (listed so that loading it refuses
    it with a reason, and so that its number stays taken). With `complete`, a directory must
    also hold a manifest.json (one still being written has none). Names of directories that are
    not versions (hidden ones aside: exports in progress, editor and OS files) are added to
    `skipped`. OSError when `model_dir` cannot be listed.

    >>> [v for v, _ in iter_versions(Path("models/default"))]  # doctest: +SKIP
    [1, 2]
    """
    found: list[tuple[int, Path]] = []
    with os.scandir(model_dir) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            version = parse_version(entry.name)
            if version is None:
                if skipped is not None and entry.is_dir():
                    skipped.add(entry.name)
                continue
            complete_dir = entry.is_dir() and (
                not complete or os.path.lexists(os.path.join(entry.path, MANIFEST_FILE))
            )
            if entry.is_symlink() or complete_dir:
                found.append((version, Path(entry.path)))
    yield from sorted(found)


def identity(version_dir: Path) -> tuple[str, int | None]:
    """(model, version) a version folder stands for: its parent's name and parse_version of its
    own (None when it is no version). A manifest must say the same.

    >>> identity(Path("models/tiny/3"))
    ('tiny', 3)
    """
    path = Path(version_dir)
    return path.parent.name, parse_version(path.name)


def newest_version(model_dir: Path, *, complete: bool = False) -> tuple[int, Path] | None:
    """The last of iter_versions(model_dir, complete=...), None when there is none."""
    versions = list(iter_versions(model_dir, complete=complete))
    return versions[-1] if versions else None


def next_version(model_dir: Path) -> int:
    """The number a new version of `model_dir` gets: 1 + the highest version folder (broken
    ones count: their number stays taken). ManifestError past MAX_VERSION."""
    newest = newest_version(model_dir)
    version = 1 if newest is None else newest[0] + 1
    if version > MAX_VERSION:
        raise ManifestError(f"{model_dir} has version {MAX_VERSION}, the highest there can be")
    return version


def version_dir(model_dir: Path, version: int) -> Path:
    """Where `version` of models/<name>/ lives: its canonical decimal name (what parse_version
    reads back). ValueError for a number that is not a version."""
    if not 0 < version <= MAX_VERSION:
        raise ValueError(f"{version} is not a version (1..{MAX_VERSION})")
    return Path(model_dir) / str(version)


@dataclass(frozen=True)
class Source:
    """Where a version's graph came from (`textserve models` and GetModel show it)."""

    kind: str = "textserve"  # textserve (a run of textserve train) | huggingface | module
    # TransformerClassifier, a transformers class (BertForSequenceClassification), pkg.mod:factory
    architecture: str = "TransformerClassifier"
    model_type: str | None = None  # Hugging Face config.model_type ("bert"), else None


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
    test_accuracy: float | None  # accuracy of model.onnx on a test split; None: none was given
    created_at: str  # ISO 8601, UTC
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # free-form (optimization, quantization...)
    source: Source = field(default_factory=Source)
    inputs: list[str] = field(default_factory=lambda: list(INPUT_NAMES))  # the graph's inputs
    activation: str = "softmax"  # softmax | sigmoid | none, applied to the logits
    threshold: float | None = None  # sigmoid's decision threshold; None: DEFAULT_THRESHOLD
    # What a text with zero ids becomes; None: such a text is refused; UNK_BY_NAME: "[UNK]"'s id
    unk_token_id: int | None = UNK_BY_NAME
    truncation_side: str = "right"  # which end of an over-long text is cut: right | left
    task: str = SEQUENCE_CLASSIFICATION  # or TOKEN_CLASSIFICATION
    # a token classifier's defaults: scheme, aggregation, ignore_labels, stride (schema)
    tagging: dict[str, Any] | None = None
    zero_shot: dict[str, int | None] | None = None  # an NLI model's label indexes (textserve.nli)

    @property
    def tags_tokens(self) -> bool:  # a token classifier: entities per text
        return self.task == TOKEN_CLASSIFICATION

    @property
    def decision_threshold(self) -> float:
        """The score at which a sigmoid label passes, unless a request sets its own."""
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    @property
    def takes_token_type_ids(self) -> bool:
        return "token_type_ids" in self.inputs

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON data: format 1 as format 1 wrote it (no format 2 field), and
        unk_token_id only when it is not format 1's rule."""
        data = asdict(self)
        if self.unk_token_id == UNK_BY_NAME:
            del data["unk_token_id"]
        if self.task == SEQUENCE_CLASSIFICATION and self.tagging is None:
            del data["task"], data["tagging"]  # a classifier's manifest as before tagging came
        if self.zero_shot is None:
            del data["zero_shot"]
        if self.format_version == 1:
            for name in V2_FIELDS:
                data.pop(name, None)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_FILE) -> Manifest:
        """A Manifest from parsed JSON, or ManifestError naming `source` and what is wrong.
        A field format 1 lacks takes its default (the one way format 1 is read)."""
        validate_manifest(data, source)
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["format_version"] = data.get("format_version", 1)
        if "source" in values:
            values["source"] = Source(**values["source"])
        return cls(**values)

    @classmethod
    def read(cls, version_dir: Path) -> Manifest:
        with _VersionDir(Path(version_dir)) as directory:
            return directory.manifest()

    def write(self, version_dir: Path) -> None:
        (Path(version_dir) / MANIFEST_FILE).write_text(self.to_json(), encoding="utf-8")

    def check(self) -> None:
        """ManifestError unless this manifest, as written, passes the schema: what the exporter
        publishes is what the server accepts."""
        validate_manifest(json.loads(self.to_json()), f"manifest of {shown(self.name)}")

    def verify_files(self, version_dir: Path) -> None:
        """Raise ManifestError unless every file's sha256 matches the manifest."""
        with _VersionDir(Path(version_dir)) as directory:
            directory.files(self)


def read_version(version_dir: Path) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest of models/<name>/<version>/ and the bytes of the files it names, each a
    regular file of the directory within its size cap, with the sha256 the manifest records.
    Raises ManifestError (or a subclass saying which check failed)."""
    with _VersionDir(Path(version_dir)) as directory:
        manifest = directory.manifest()
        return manifest, directory.files(manifest)


def open_version(version_dir: Path) -> tuple[Manifest, dict[str, bytes], VerifiedFile]:
    """As read_version, except model.onnx: hashed while streamed and handed back open
    (VerifiedFile), so that loading it costs no copy of the file in memory. The caller closes
    it. The other files' bytes as read_version's."""
    with _VersionDir(Path(version_dir)) as directory:
        manifest = directory.manifest()
        model = directory.verified(MODEL_FILE, manifest.sha256[MODEL_FILE])
        try:
            files = {f: directory.checked(f, manifest) for f in CONTRACT_FILES if f != MODEL_FILE}
        except BaseException:
            model.close()
            raise
        return manifest, files, model


class _VersionDir:
    """A version directory opened once, its files opened relative to it: a path swapped for a
    symbolic link between a check and the read cannot lead outside."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def __enter__(self) -> _VersionDir:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and self.path.is_symlink():
                raise UnsafeFileError(
                    f"{self.path} is a symbolic link; a version must be a directory of its own"
                ) from None
            raise ManifestError(f"{self.path} cannot be opened: {exc.strerror or exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def manifest(self) -> Manifest:
        where = self.path / MANIFEST_FILE
        raw = self.read(MANIFEST_FILE)
        try:
            data = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise ManifestError(f"{where} is nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
            raise ManifestError(f"{where} is unreadable: {_cut(str(exc))}") from None
        return Manifest.from_dict(data, str(where))

    def files(self, manifest: Manifest) -> dict[str, bytes]:
        # the schema allows exactly these keys, no paths
        return {fname: self.checked(fname, manifest) for fname in CONTRACT_FILES}

    def checked(self, fname: str, manifest: Manifest) -> bytes:
        """The bytes of `fname`, with the sha256 the manifest records (ChecksumError if not)."""
        data = self.read(fname)
        actual = hashlib.sha256(data).hexdigest()
        expected = manifest.sha256[fname]
        if actual != expected:
            raise ChecksumError(
                f"{fname} sha256 {actual[:12]}… does not match the manifest's {expected[:12]}…"
            )
        return data

    def _open(self, fname: str) -> tuple[int, os.stat_result]:
        """`fname` opened: a regular file of this directory no larger than its cap."""
        where = self.path / fname
        cap = MAX_FILE_BYTES[fname]
        # O_NOFOLLOW: a symbolic link is refused, wherever it points. O_NONBLOCK: opening a FIFO
        # must not hang the scan (no effect on regular files).
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(fname, flags, dir_fd=self._fd)
        except FileNotFoundError:
            # "does not exist" for the manifest: the words `textserve models` always used
            gone = "does not exist" if fname == MANIFEST_FILE else "is missing"
            raise MissingFileError(f"{where} {gone}", fname) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFileError(
                    f"{where} is a symbolic link; the files of a version must be regular files "
                    "inside its directory"
                ) from None
            raise ManifestError(f"{where} cannot be opened: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeFileError(f"{where} is not a regular file")
            if info.st_size > cap:
                raise UnsafeFileError(
                    f"{where} is {info.st_size} bytes, over the {cap}-byte cap for {fname}"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def read(self, fname: str) -> bytes:
        """The whole of `fname`, a regular file of this directory no larger than its cap."""
        where = self.path / fname
        fd, info = self._open(fname)
        try:
            # One byte more than fstat said: a file still growing is noticed, not cut short.
            want, chunks, got = info.st_size + 1, [], 0
            while got < want and (block := os.read(fd, want - got)):
                chunks.append(block)
                got += len(block)
        except OSError as exc:
            raise ManifestError(f"{where} cannot be read: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if got != info.st_size:
            raise ManifestError(f"{where} changed while it was read; it is tried again later")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def verified(self, fname: str, expected: str) -> VerifiedFile:
        """`fname` open, its sha256 computed while streaming it in 1 MiB blocks (never the
        whole file in memory) and equal to `expected`; ChecksumError otherwise."""
        where = self.path / fname
        fd, info = self._open(fname)
        try:
            actual, got = _sha256_fd(fd)
            if got != info.st_size:
                raise ManifestError(f"{where} changed while it was read; it is tried again later")
            if actual != expected:
                raise ChecksumError(
                    f"{fname} sha256 {actual[:12]}… does not match the manifest's {expected[:12]}…"
                )
        except OSError as exc:
            os.close(fd)
            raise ManifestError(f"{where} cannot be read: {exc.strerror or exc}") from None
        except BaseException:
            os.close(fd)
            raise
        return VerifiedFile(fd, where, _identity(info), expected)


def _sha256_fd(fd: int) -> tuple[str, int]:
    """The sha256 of an open file's bytes (read in 1 MiB blocks by offset) and their count."""
    digest, got = hashlib.sha256(), 0
    while block := os.pread(fd, 1 << 20, got):
        digest.update(block)
        got += len(block)
    return digest.hexdigest(), got


def _identity(info: os.stat_result) -> tuple[int, ...]:
    # any write changes mtime and ctime (utime can reset mtime, never ctime); a new inode, the size
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class VerifiedFile:
    """An open file whose bytes matched the manifest's sha256. A loader reads it through
    `path` — the open descriptor (/proc/self/fd/N: the same file, no name looked up again) —
    while it is open, then calls `unchanged()`: a file written to after it was hashed is refused.
    So a large model.onnx is never held in memory by the check: onnxruntime reads it once.
    Close it (or use it in a `with` block) when the load is done."""

    def __init__(
        self, fd: int, where: Path, identity: tuple[int, ...], sha256: str | None = None
    ) -> None:
        self.fd, self.where, self._identity, self._sha256 = fd, where, identity, sha256

    @property
    def path(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}")

    def unchanged(self) -> None:
        """ManifestError unless the file is still the one that was hashed. Only the inode's
        change time moving (a file renamed over its name, a chmod: the descriptor still holds
        the hashed bytes) costs one more hash of the bytes through the descriptor; a new inode,
        size or modification time is refused at once."""
        now = _identity(os.fstat(self.fd))
        if now == self._identity:
            return
        same_bytes = now[:3] == self._identity[:3] and self._sha256 is not None
        if same_bytes and _sha256_fd(self.fd) == (self._sha256, now[1]):
            return
        raise ManifestError(f"{self.where} changed while it was loaded; it is tried again later")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> VerifiedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def validate_manifest(data: Any, source: str = MANIFEST_FILE) -> None:
    """ManifestError naming `source` and the first problem unless `data` (parsed JSON) is a
    manifest by textserve/schemas/manifest.schema.json."""
    _check_plain(data, source)
    if isinstance(data, dict):
        _check_format(data, source)
    errors = sorted(_validator().iter_errors(data), key=_error_order)
    missing = [
        name
        for e in errors
        if not e.path and e.validator == "required"
        for name in e.validator_value
        if name not in data
    ]
    if missing:
        raise ManifestError(f"{source} is missing field(s): {', '.join(missing)}")
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path)
        raise ManifestError(
            f"{source}: {_cut(where, 64) + ': ' if where else ''}" + _cut(errors[0].message)
        )
    _check_meaning(data, source)


def _check_format(data: dict[str, Any], source: str) -> None:
    """The format_version rules, before the schema (whose if/else would blame other fields)."""
    form = data.get("format_version", 1)
    if type(form) is not int or form not in FORMAT_VERSIONS:
        raise ManifestError(
            f"{source}: format_version {_cut(repr(form), 32)} is not one this server reads "
            f"({', '.join(map(str, FORMAT_VERSIONS))})"
        )
    newer = [name for name in V2_FIELDS if name in data]
    if form == 1 and newer:
        raise ManifestError(
            f"{source} has format 2 field(s) {', '.join(newer)} but format_version 1; "
            'write "format_version": 2'
        )


def _check_meaning(data: dict[str, Any], source: str) -> None:
    """What the schema does not say: a regression model (activation none) has one output; a
    token classifier, and only it, has tagging defaults (softmax); zero_shot names two labels."""
    tags = data.get("task") == TOKEN_CLASSIFICATION
    if tags != (data.get("tagging") is not None) or (tags and data["activation"] != "softmax"):
        raise ManifestError(
            f"{source}: a token classifier (task {TOKEN_CLASSIFICATION!r}), and only it, has "
            "'tagging' defaults, and its activation is 'softmax'"
        )
    if data.get("activation") == "none" and len(data["labels"]) != 1:
        raise ManifestError(
            f"{source}: activation 'none' (regression, one raw score) takes exactly one label, "
            f"the manifest has {len(data['labels'])}"
        )
    if (problem := zero_shot_problem(data.get("zero_shot"), len(data["labels"]))) is not None:
        raise ManifestError(f"{source}: {problem}")


def _error_order(error: Any) -> tuple[int, str]:
    return (len(error.absolute_path), str(list(error.absolute_path)))


def _check_plain(data: Any, source: str) -> None:
    """What JSON Schema cannot say: nesting depth, and strings that are not text (a lone
    surrogate from a \ud800 escape parses, then fails every response that carries it)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ManifestError(f"{source} is nested over {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ManifestError(
                    f"{source}: the string {shown(value)} is not valid Unicode text"
                ) from None


@cache
def _validator() -> Any:
    """The schema's Draft 2020-12 validator, built once (jsonschema imported only here)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    # JSON Schema's integer takes 1.0 too; a float version or max_length fails protobuf later.
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = jsonschema.validators.extend(base, type_checker=checker)
    text = resources.files("textserve").joinpath(*SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema = json.loads(text)
    strict.check_schema(schema)
    return strict(schema)


def _cut(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit] + "…"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
