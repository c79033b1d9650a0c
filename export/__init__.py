"""Export training runs to ONNX model versions: export, validate, optimize, publish, bench."""
