"""`textserve export` of a broken or hostile Hugging Face folder: one line, exit 2, nothing read
outside the folder, nothing published (issue #39).

Each case copies one complete save_pretrained folder (tests/foreign.py: a tiny BERT) and breaks
one thing in it: a file that is not what its name says (garbled, truncated, empty, a list, a
directory), a number out of range in config.json, weights or a tokenizer pointing outside the
folder, a tokenizer with ids past the model's embedding, labels the manifest and the log cannot
carry. The export must end with exactly one line on stderr naming the file and what is wrong,
exit 2, no traceback, and leave nothing in the repository.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from tests import foreign, untrusted
from tests.unprivileged import drop_privileges, shared_dir
from textserve import cli

Break = Callable[[Path], object]
DROP = object()  # config(...)'s value for a key to remove


def export(folder: Path, repository: Path) -> tuple[int, str]:
    """`textserve export FOLDER` as a user runs it: (exit code, stderr)."""
    err = io.StringIO()
    argv = ["export", str(folder), "--repository", str(repository), "--name", "x"]
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main([*argv, "--threads", "1"])
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def assert_refused(code: int, err: str, culprit: str, repository: Path) -> None:
    """Exit 2, one line naming the culprit, no traceback, nothing published."""
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.count("\n") == 1 and err.startswith("textserve export: error: "), err[-3000:]
    assert culprit in err, err
    model_dir = repository / "x"
    assert not model_dir.exists() or not any(model_dir.iterdir())


@pytest.fixture(scope="module")
def complete(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return foreign.build("bert", tmp_path_factory.mktemp("complete") / "bert", num_labels=3)


def copy_of(complete: Path, into: Path) -> Path:
    return Path(shutil.copytree(complete, into))


def broken(complete: Path, tmp_path: Path, damage: Break) -> Path:
    """A copy of the complete folder, broken by `damage`."""
    folder = copy_of(complete, tmp_path / "broken")
    damage(folder)
    return folder


# --- how each case breaks its folder -------------------------------------------------------------


def config(**changes: Any) -> Break:
    """config.json with `changes` (DROP: the key removed)."""

    def edit(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is DROP:
                raw.pop(key, None)
            else:
                raw[key] = value
        (folder / "config.json").write_text(json.dumps(raw))

    return edit


def write(name: str, data: str | bytes) -> Break:
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return edit


def directory(name: str) -> Break:
    """A directory where the file should be."""

    def edit(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).mkdir()
        (folder / name / "inside").write_text("{}")

    return edit


def truncated(name: str, keep: float = 0.5) -> Break:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])

    return edit


def tokenizer_config(**changes: Any) -> Break:
    def edit(folder: Path) -> None:
        path = folder / "tokenizer_config.json"
        raw = json.loads(path.read_text())
        raw.update(changes)
        path.write_text(json.dumps(raw))

    return edit


def header(claimed: int, rest: bytes = b"") -> bytes:
    """A safetensors file's first bytes: its header's length (little-endian u64), then `rest`."""
    return claimed.to_bytes(8, "little") + rest


def only(name: str, data: bytes) -> Break:
    """The weights as `name` only (model.safetensors removed)."""

    def edit(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / name).write_bytes(data)

    return edit


def sharded(where: Callable[[Path], str]) -> Break:
    """model.safetensors moved out as a shard the index names by where(folder)."""

    def edit(folder: Path) -> None:
        from safetensors import safe_open

        with safe_open(folder / "model.safetensors", framework="numpy") as f:
            keys = list(f.keys())
        shard = where(folder)
        target = folder / shard if not Path(shard).is_absolute() else Path(shard)
        shutil.move(folder / "model.safetensors", target)
        index = {"metadata": {}, "weight_map": dict.fromkeys(keys, shard)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return edit


def index(text: str) -> Break:
    """model.safetensors.index.json as `text`, model.safetensors removed."""
    return only("model.safetensors.index.json", text.encode())


def symlinked(name: str) -> Break:
    """`name` a symlink to a copy of itself outside the folder."""

    def edit(folder: Path) -> None:
        outside = folder.parent / f"outside-{name}"
        shutil.move(folder / name, outside)
        (folder / name).symlink_to(outside)

    return edit


def emptied(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


HUGE = 10**12
GARBAGE = bytes(range(256)) * 4

CASES: list[tuple[str, Break, str]] = [
    # config.json
    ("config.json not JSON", write("config.json", '{"model_type": "bert",'), "config.json"),
    ("config.json binary", write("config.json", GARBAGE), "config.json"),
    ("config.json empty", write("config.json", ""), "config.json"),
    ("config.json a list", write("config.json", '["bert"]'), "config.json holds an array"),
    ("config.json nested deep", write("config.json", "[" * 100_000), "nested too deeply"),
    ("config.json a directory", directory("config.json"), "config.json is a directory"),
    ("model_type a number", config(model_type=5), 'config.json\'s "model_type"'),
    ("model_type unknown", config(model_type="no-such-model"), "config.json"),
    ("num_labels huge", config(id2label=DROP, label2id=DROP, num_labels=HUGE), '"num_labels"'),
    ("num_labels negative", config(id2label=DROP, label2id=DROP, num_labels=-1), '"num_labels"'),
    ("num_labels a string", config(id2label=DROP, label2id=DROP, num_labels="3"), '"num_labels"'),
    ("vocab_size huge", config(vocab_size=HUGE), '"vocab_size"'),
    ("vocab_size negative", config(vocab_size=-300), '"vocab_size"'),
    ("vocab_size a string", config(vocab_size="300"), '"vocab_size"'),
    ("vocab_size a float", config(vocab_size=300.5), '"vocab_size"'),
    ("vocab_size large", config(vocab_size=2**22), "weight values, the checkpoint holds"),
    ("max_position_embeddings huge", config(max_position_embeddings=HUGE), '"max_position_e'),
    ("max_position_embeddings negative", config(max_position_embeddings=-1), '"max_position_e'),
    ("hidden_size a string", config(hidden_size="32"), '"hidden_size"'),
    ("num_hidden_layers huge", config(num_hidden_layers=10**9), '"num_hidden_layers"'),
    ("num_attention_heads zero", config(num_attention_heads=0), '"num_attention_heads"'),
    ("type_vocab_size huge", config(type_vocab_size=HUGE), '"type_vocab_size"'),
    ("pad_token_id past the vocabulary", config(pad_token_id=10**6), '"pad_token_id"'),
    ("pad_token_id a list", config(pad_token_id=[0]), '"pad_token_id" is an array'),
    ("id2label keys not integers", config(id2label={"a": "x", "b": "y", "c": "z"}), "id2label"),
    ("id2label a list", config(id2label=["x", "y", "z"]), "id2label"),
    ("id2label values not strings", config(id2label={"0": 1, "1": None, "2": [3]}), "id2label"),
    (
        "id2label index past the logits",
        config(id2label={"0": "a", "1": "b", "5": "c"}),
        "names label 5",
    ),
    ("id2label index huge", config(id2label={"0": "a", "1": "b", str(HUGE): "c"}), "id2label"),
    ("problem_type a list", config(problem_type=["regression"]), '"problem_type"'),
    ("hidden_act unknown", config(hidden_act="no-such-activation"), "config.json"),
    ("layer_norm_eps a string", config(layer_norm_eps="tiny"), "config.json"),
    # tokenizer.json
    ("tokenizer.json not JSON", write("tokenizer.json", "{not json"), "tokenizer.json"),
    ("tokenizer.json empty", write("tokenizer.json", ""), "tokenizer.json"),
    ("tokenizer.json binary", write("tokenizer.json", GARBAGE), "tokenizer.json"),
    ("tokenizer.json truncated", truncated("tokenizer.json"), "tokenizer.json"),
    ("tokenizer.json an empty object", write("tokenizer.json", "{}"), "tokenizer.json"),
    ("tokenizer.json a list", write("tokenizer.json", "[]"), "tokenizer.json"),
    ("tokenizer.json a directory", directory("tokenizer.json"), "tokenizer.json is a directory"),
    # tokenizer_config.json, special_tokens_map.json
    ("tokenizer_config.json not JSON", write("tokenizer_config.json", "{"), "tokenizer_config"),
    ("tokenizer_config.json a list", write("tokenizer_config.json", "[]"), "tokenizer_config"),
    ("tokenizer_config.json binary", write("tokenizer_config.json", GARBAGE), "tokenizer_config"),
    ("tokenizer_config.json a directory", directory("tokenizer_config.json"), "tokenizer_config"),
    ("model_max_length a string", tokenizer_config(model_max_length="long"), "model_max_length"),
    ("model_max_length negative", tokenizer_config(model_max_length=-5), "model_max_length"),
    ("tokenizer_class a number", tokenizer_config(tokenizer_class=5), '"tokenizer_class"'),
    ("special_tokens_map.json not JSON", write("special_tokens_map.json", "{"), "special_tokens"),
    # weights
    ("model.safetensors truncated", truncated("model.safetensors", 0.7), "model.safetensors"),
    ("model.safetensors cut in its header", truncated("model.safetensors", 0.001), "safetensors"),
    ("model.safetensors garbage", write("model.safetensors", GARBAGE), "model.safetensors"),
    ("model.safetensors empty", write("model.safetensors", ""), "model.safetensors"),
    ("header length huge", write("model.safetensors", header(2**63)), "model.safetensors"),
    ("header not JSON", write("model.safetensors", header(4, b"{{{{")), "model.safetensors"),
    ("header a list", write("model.safetensors", header(2, b"[]")), "model.safetensors"),
    ("model.safetensors a directory", directory("model.safetensors"), "model.safetensors is a"),
    ("pytorch_model.bin garbage", only("pytorch_model.bin", GARBAGE), "pytorch_model.bin"),
    ("pytorch_model.bin empty", only("pytorch_model.bin", b""), "pytorch_model.bin"),
    ("index not JSON", index("{"), "model.safetensors.index.json"),
    ("index without weight_map", index('{"metadata": {}}'), "weight_map"),
    ("index naming a missing shard", index('{"weight_map": {"a": "shard.safetensors"}}'), "shard"),
    ("index weight_map a list", index('{"weight_map": ["a"]}'), "weight_map"),
    # the folder itself
    ("empty folder", emptied, "is neither a textserve run folder"),
]
# what reaches outside the folder: refused before it is read
OUTSIDE: list[tuple[str, Break, str]] = [
    ("shard in the parent folder", sharded(lambda f: "../elsewhere.safetensors"), "../elsewhere"),
    ("shard by absolute path", sharded(lambda f: str(f.parent / "abs.safetensors")), "abs.safet"),
    ("config.json a symlink out", symlinked("config.json"), "config.json"),
    ("tokenizer.json a symlink out", symlinked("tokenizer.json"), "tokenizer.json"),
    ("model.safetensors a symlink out", symlinked("model.safetensors"), "model.safetensors"),
    (
        "tokenizer_config.json a symlink out",
        symlinked("tokenizer_config.json"),
        "tokenizer_config.json",
    ),
]


@pytest.mark.parametrize(("case", "damage", "culprit"), CASES, ids=[c[0] for c in CASES])
def test_a_broken_folder_is_one_line_and_exit_2(
    case: str, damage: Break, culprit: str, complete: Path, tmp_path: Path
) -> None:
    code, err = export(broken(complete, tmp_path, damage), tmp_path / "models")
    assert_refused(code, err, culprit, tmp_path / "models")


@pytest.mark.parametrize(("case", "damage", "culprit"), OUTSIDE, ids=[c[0] for c in OUTSIDE])
def test_nothing_outside_the_folder_is_read(
    case: str, damage: Break, culprit: str, complete: Path, tmp_path: Path
) -> None:
    folder = broken(complete, tmp_path, damage)
    outside = {str(p.resolve()) for p in tmp_path.iterdir() if p.is_file()}
    untrusted.WATCHED.update(outside)
    untrusted.OPENED.clear()
    try:
        code, err = export(folder, tmp_path / "models")
        opened = list(untrusted.OPENED)
    finally:
        untrusted.WATCHED.difference_update(outside)
    assert_refused(code, err, culprit, tmp_path / "models")
    assert "outside" in err
    assert opened == []


def _export_unreadable(warm: Path, folders: list[Path], repository: Path) -> list[tuple[int, str]]:
    """Each folder's export as `nobody` (tests/unprivileged.py): root reads any file. `warm` is
    exported first, as root, so that what an export imports is imported (the interpreter's own
    files may be root's only): a folder refused late, once its model and tokenizer are loaded."""
    import encodings.raw_unicode_escape  # noqa: F401  (the results' way back)

    assert export(warm, repository / "warm")[0] == 2
    drop_privileges()
    return [export(folder, repository / folder.name) for folder in folders]


UNREADABLE = ["config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"]


def test_an_unreadable_file_is_one_line_naming_it(complete: Path) -> None:
    with shared_dir() as shared:
        warm = copy_of(complete, shared / "warm")
        config(id2label={"0": "a", "1": "b\nc", "2": "d"})(warm)  # refused after loading
        folders = []
        for name in UNREADABLE:
            folder = copy_of(complete, shared / name)
            for path in (folder, *folder.iterdir()):
                path.chmod(0o755 if path.is_dir() else 0o644)
            (folder / name).chmod(0)
            folders.append(folder)
        repository = shared / "models"
        repository.mkdir(mode=0o777)
        repository.chmod(0o777)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            done = pool.submit(_export_unreadable, warm, folders, repository).result(timeout=240)
        for name, (code, err) in zip(UNREADABLE, done, strict=True):
            assert_refused(code, err, f"{name} cannot be read: Permission denied", repository)


def test_a_tokenizer_id_past_the_embedding_is_refused(complete: Path, tmp_path: Path) -> None:
    # the server refuses a version whose tokenizer has an id the embedding has no row for
    # (onnxruntime's Gather fails on it): the export refuses it first
    from tokenizers import Tokenizer

    folder = copy_of(complete, tmp_path / "grown")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert tokenizer.get_vocab_size(with_added_tokens=True) == rows  # every id has its row
    tokenizer.add_tokens(["zzzunseen"])
    tokenizer.save(str(folder / "tokenizer.json"))
    code, err = export(folder, tmp_path / "models")
    assert_refused(code, err, f"ids go up to {rows} ('zzzunseen'), the model's embedding has "
                   f"{rows} rows (ids 0 to {rows - 1})", tmp_path / "models")  # fmt: skip
    assert err.startswith(f"textserve export: error: {folder / 'tokenizer.json'}: ")


BAD_LABELS = [  # (case, label 1, what the refusal says after "label 1 ")
    ("a newline", "neg\nforged log", r"('neg\nforged log') holds the control character '\n'"),
    ("a carriage return", "neg\r", r"('neg\r') holds the control character '\r'"),
    ("a NUL", "ne\x00g", r"('ne\x00g') holds the control character '\x00'"),
    ("an escape sequence", "\x1b[31mred", r"('\x1b[31mred') holds the control character '\x1b'"),
    ("a C1 control", "neg\x85", r"('neg\x85') holds the control character '\x85'"),
    ("a line separator", "neg\u2028x", r"('neg\u2028x') holds the control character '\u2028'"),
    ("nothing", "", "('') is empty"),
    ("1,025 characters", "n" * 1025, f"('{'n' * 64}…' (1025 characters)) is 1,025 characters"),
]


@pytest.mark.parametrize(
    ("bad", "message"), [c[1:] for c in BAD_LABELS], ids=[c[0] for c in BAD_LABELS]
)
def test_a_label_no_answer_or_log_line_can_carry_is_refused(
    bad: str, message: str, complete: Path, tmp_path: Path
) -> None:
    folder = copy_of(complete, tmp_path / "labelled")
    labels = ["negative", bad, "positive"]
    config(id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)})(folder)
    code, err = export(folder, tmp_path / "models")
    assert_refused(code, err, f"config.json's id2label: label 1 {message}", tmp_path / "models")


def test_two_outputs_of_one_name_are_refused(complete: Path, tmp_path: Path) -> None:
    folder = copy_of(complete, tmp_path / "twice")
    config(id2label={"0": "positive", "1": "neutral", "2": "positive"}, label2id=DROP)(folder)
    code, err = export(folder, tmp_path / "models")
    message = "config.json's id2label: label 2 ('positive') is label 0's name too"
    assert_refused(code, err, message, tmp_path / "models")


def test_an_error_pointing_at_transformers_report_names_what_it_reports(
    complete: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers raises "look at the above report" after logging a report that the export's
    # verbosity never shows: the refusal says what the report named instead
    import logging

    import transformers
    from transformers.utils.loading_report import LoadStateDictInfo, log_state_dict_report

    auto = transformers.AutoModelForSequenceClassification

    def from_pretrained(folder: Path, **kwargs: Any) -> Any:
        model = auto.from_config(kwargs["config"])
        info = LoadStateDictInfo(
            missing_keys=set(),
            unexpected_keys=set(),
            mismatched_keys=set(),
            error_msgs=[],
            conversion_errors={"classifier.weight": "Concatenate: shapes differ"},
            skipped_pp_keys=set(),
        )
        logger = logging.getLogger("transformers.modeling_utils")
        log_state_dict_report(model, str(folder), False, info, logger=logger)
        raise AssertionError("log_state_dict_report raises on a conversion error")

    monkeypatch.setattr(auto, "from_pretrained", from_pretrained)
    code, err = export(copy_of(complete, tmp_path / "converted"), tmp_path / "models")
    message = "transformers cannot load the model: its loading report names classifier.weight "
    assert_refused(code, err, message + "(conversion)", tmp_path / "models")
    assert "above" not in err


def hub_snapshot(complete: Path, root: Path) -> Path:
    """`complete` laid out as the Hugging Face cache keeps a download: every file of
    hub/models--org--name/snapshots/<revision>/ a relative symlink into the
    blobs folder beside snapshots/."""
    repo = root / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for index, path in enumerate(sorted(complete.iterdir())):
        blob = repo / "blobs" / f"{index:040x}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


def test_a_hugging_face_cache_snapshot_exports_and_its_links_stay_in_its_blobs(
    complete: Path, tmp_path: Path
) -> None:
    snapshot = hub_snapshot(complete, tmp_path)
    code, err = export(snapshot, tmp_path / "models")
    assert code == 0, err
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (snapshot / "special_tokens_map.json").symlink_to(
        Path("..") / ".." / ".." / ".." / ".." / secret.name
    )
    code, err = export(snapshot, tmp_path / "models2")
    assert code == 2 and "outside" in err, err
