"""Training side of textserve: data, tokenizer, TransformerClassifier, training, run directories.

Importing this package imports no torch: the console script imports textserve.model.cli to
build its parser.
"""

# One copy of each module: this folder is textserve.model (the wheel's package-dir, the
# checkout's textserve/model symlink). Imported as top-level `model` (the repository root on
# sys.path) it would be a second copy whose classes are not textserve.model's.
if __name__ != "textserve.model":
    raise ImportError(
        f"import textserve.model, not {__name__}: the model/ folder is the package "
        "textserve.model (see docs/architecture.md)"
    )
