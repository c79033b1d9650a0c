"""Export a model (a training run, a Hugging Face folder, a --module) to ONNX model versions: one
pipeline (pipeline.py) of sources, checks, gates and an atomic publish; the export bench."""

# One copy of each module: this folder is textserve.export (the wheel's package-dir, the
# checkout's textserve/export symlink). Imported as top-level `export` (the repository root on
# sys.path) it would be a second copy whose classes are not textserve.export's.
if __name__ != "textserve.export":
    raise ImportError(
        f"import textserve.export, not {__name__}: the export/ folder is the package "
        "textserve.export (see docs/architecture.md)"
    )
