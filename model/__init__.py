"""Training side of textserve: data, tokenizer, TransformerClassifier, training, run directories.

Importing this package imports no torch: the console script imports textserve.model.cli to
build its parser.
"""
