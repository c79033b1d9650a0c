"""`textserve classify [TEXT ...]`: classify texts against a running server.

Texts come from the arguments, else from --file, else one per line from standard input;
sentence pairs (a model exported with a pair template, e.g. NLI) take their second texts from
--pair (once per text) or --pairs-file (line by line). Prints a table (label, score, text) by
default; --json prints one JSON document.
--stream sends them over ClassifyStream (the bulk path: cheaper per text on the server),
with a progress line on standard error when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from textserve import connect
from textserve.cli import CliError, env_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify")
    parser.add_argument("--file", help="read texts from this file, one per line ('-': stdin)")
    parser.add_argument(
        "--pair",
        action="append",
        metavar="TEXT",
        help="the second text of a sentence pair, once per TEXT in the same order",
    )
    parser.add_argument(
        "--pairs-file", help="second texts of sentence pairs, one per line, line N for text N"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help="multi-label models: the score a label must reach to be listed, in (0, 1) "
        "(default: the model's own)",
    )
    env_flag(parser, "TEXTSERVE_", "server", "127.0.0.1:50051", "server address HOST:PORT; "
             "several (comma-separated) or dns:///NAME:PORT: balanced per request; "
             "http://HOST:PORT: over the HTTP port (POST /v1/classify)")  # fmt: skip
    parser.add_argument("--model", help="model name (default: the server's default model)")
    parser.add_argument("--version", type=int, help="model version (default: the newest)")
    parser.add_argument("--all-scores", action="store_true", help="show every label's score")
    parser.add_argument("--top-k", type=int, default=0, help="show the k best labels per text")
    parser.add_argument(
        "--no-truncate", action="store_true", help="refuse texts longer than the model takes"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--aggregation",
        choices=("none", "simple", "first", "average", "max"),
        help="token classifiers: how tokens become entities (default: the model's own)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help="texts per request (default: 256), with --stream per message (default: 1)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="send the texts over one ClassifyStream per connection (bulk: the server batches "
        "the messages together; less CPU per text than unary requests)",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress line on standard error (shown with --stream when it is a terminal)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument(
        "--connections",
        type=int,
        default=4,
        help="connections (one request in flight on each) for texts of several requests: a "
        "server with --workers N takes connections, not requests, to its N processes; they "
        "are spread evenly over them (4)",
    )
    connect.add_arguments(parser)


def _read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file (--file, --pairs-file); CliError naming it otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_texts(args: argparse.Namespace) -> list[str]:
    if args.texts:
        return list(args.texts)
    if args.file and args.file != "-":
        lines = _read_lines(args.file)
    elif args.file == "-" or not sys.stdin.isatty():
        lines = sys.stdin.read().splitlines()
    else:
        raise CliError("no texts: give them as arguments, with --file, or on standard input")
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise CliError("no texts: the input has only blank lines")
    return texts


def read_pairs(args: argparse.Namespace, texts: Sequence[str]) -> list[str] | None:
    """The second texts of sentence pairs, one per text, or None when none were given."""
    if args.pair is not None and args.pairs_file is not None:
        raise CliError("give the pairs' second texts with --pair or with --pairs-file, not both")
    if args.pair is not None:
        pairs = list(args.pair)
    elif args.pairs_file is not None:
        pairs = [line for line in _read_lines(args.pairs_file) if line.strip()]
    else:
        return None
    if len(pairs) != len(texts):
        raise CliError(f"{len(pairs)} second texts (--pair/--pairs-file) for {len(texts)} texts")
    return pairs


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def format_table(texts: Sequence[str], predictions: list[Any], all_scores: bool, top_k: int) -> str:
    """A readable table: LABEL, SCORE, TEXT (long texts cut), optional scores after the text."""
    rows = []
    for text, pred in zip(texts, predictions, strict=True):
        shown_scores = pred.scores.items() if all_scores else pred.top if top_k else ()
        extra = "".join(
            f"  {k}={v:.4f}" if i == 0 else f" {k}={v:.4f}" for i, (k, v) in enumerate(shown_scores)
        )
        if pred.labels_over_threshold:  # multi-label: every label that reached the threshold
            extra += "  [" + ", ".join(pred.labels_over_threshold) + "]"
        shown = " ".join(text.split())
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        rows.append((pred.label, f"{pred.score:.4f}", shown + extra))
    width = max([len("LABEL"), *(len(r[0]) for r in rows)])
    lines = [f"{'LABEL':<{width}}  SCORE   TEXT"]
    lines += [f"{label:<{width}}  {score}  {text}" for label, score, text in rows]
    return "\n".join(lines)


class Progress:
    """A one-line progress report on a terminal (`\\r`-rewritten at most every `every` seconds):
    a bulk run's only chatter, so a small line rather than a progress-bar dependency."""

    def __init__(self, total: int, out: Any = None, every: float = 0.2) -> None:
        self.total = total
        self.out = out if out is not None else sys.stderr
        self.every = every
        self.done = 0
        self.started = self.shown = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.shown >= self.every or self.done >= self.total:
            self.shown = now
            rate = self.done / max(now - self.started, 1e-9)
            percent = 100.0 * self.done / self.total if self.total else 100.0
            self.out.write(f"\r{self.done}/{self.total} texts ({percent:.0f}%), {rate:.0f} texts/s")
            self.out.flush()

    def close(self) -> None:
        if self.done:
            self.out.write("\n")
            self.out.flush()


def _unary(
    args: argparse.Namespace,
    requests: list[Sequence[str]],
    pairs: list[Sequence[str]] | None,
    connections: int,
) -> tuple[list[Any], str | None, int | None]:
    """Unary Classify calls of --batch-size texts, `connections` in flight, answers in order
    (over HTTP, POST /v1/classify, when --server is an http:// or https:// URL)."""
    from textserve.client import Client
    from textserve.http_client import HttpClient, is_http

    predictions: list[Any] = []
    model = version = None
    with (
        (HttpClient if is_http(args.server) else Client)(
            args.server,
            timeout=args.timeout,
            connections=connections,
            **connect.client_options(args),
        ) as client,
        ThreadPoolExecutor(connections) as pool,
    ):
        if isinstance(client, Client) and connections > 1 and len(requests) > 1:
            client.spread()  # evenly over a --workers server's processes (textserve.spread)

        def classify(chunk: Sequence[str], second: Sequence[str] | None) -> Any:
            return client.classify(
                chunk,
                model=args.model,
                version=args.version,
                truncate=False if args.no_truncate else None,
                top_k=args.top_k,
                all_scores=args.all_scores,
                text_pairs=second,
                threshold=args.threshold,
            )

        seconds = pairs if pairs is not None else [None] * len(requests)
        for result in pool.map(classify, requests, seconds):  # in order, `connections` at once
            model, version = result.model, result.version
            predictions.extend(result.predictions)
    return predictions, model, version


def _tagged(args: argparse.Namespace, requests: list[Sequence[str]]) -> bool:
    """A token classifier's entities printed (commands/tagging.py); False for other models."""
    from textserve.client import Client
    from textserve.commands import tagging
    from textserve.http_client import is_http

    if is_http(args.server):
        return False
    with Client(args.server, timeout=args.timeout, **connect.client_options(args)) as client:
        if not tagging.is_token_model(client, args):
            return False
        document = tagging.tag_all(client, args, requests)
    tagging.print_entities(document, args.json)
    return True


def json_document(
    args: argparse.Namespace,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    predictions: list[Any],
    model: str | None,
    version: int | None,
) -> dict[str, Any]:
    """--json's document: the model and one result per text, with what the flags asked for."""
    return {
        "model": model,
        "version": version,
        "results": [
            {
                "text": text,
                **({"pair": pairs[i]} if pairs is not None else {}),
                "label": p.label,
                "score": p.score,
                **({"scores": p.scores} if args.all_scores else {}),
                **({"top": [list(t) for t in p.top]} if args.top_k else {}),
                **(
                    {"labels_over_threshold": p.labels_over_threshold}
                    if p.labels_over_threshold or args.threshold is not None
                    else {}
                ),
                "num_tokens": p.num_tokens,
                "truncated": p.truncated,
                "cached": p.cached,
            }
            for i, (text, p) in enumerate(zip(texts, predictions, strict=True))
        ],
    }


def run(args: argparse.Namespace) -> int:
    from textserve.client import Client, ClientError

    if args.batch_size is not None and args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    if args.connections < 1:
        raise CliError(f"--connections must be at least 1, got {args.connections}")
    if args.stream and args.server.startswith(("http://", "https://")):
        raise CliError("--stream needs gRPC (ClassifyStream): give --server HOST:PORT")
    if args.threshold is not None and not 0 < args.threshold < 1:
        raise CliError(f"--threshold must be within (0, 1), got {args.threshold:g}")
    texts = read_texts(args)
    pairs = read_pairs(args, texts)
    predictions: list[Any] = []
    model = version = None
    batch_size = args.batch_size or (1 if args.stream else 256)
    requests = list(chunks(texts, batch_size))
    connections = min(args.connections, len(requests)) or 1
    progress = (
        Progress(len(texts)) if args.stream and args.progress and sys.stderr.isatty() else None
    )
    try:
        if args.stream:
            with Client(
                args.server, connections=connections, **connect.client_options(args)
            ) as client:
                for result in client.classify_stream(
                    texts,
                    model=args.model,
                    version=args.version,
                    truncate=False if args.no_truncate else None,
                    top_k=args.top_k,
                    all_scores=args.all_scores,
                    texts_per_message=batch_size,
                    text_pairs=pairs,
                    threshold=args.threshold,
                ):
                    model, version = result.model, result.version
                    predictions.extend(result.predictions)
                    if progress is not None:
                        progress.update(len(result.predictions))
        elif pairs is None and _tagged(args, requests):
            return 0
        else:
            second = None if pairs is None else list(chunks(pairs, batch_size))
            predictions, model, version = _unary(args, requests, second, connections)
    except ClientError as exc:
        if exc.code == "UNAVAILABLE":
            raise CliError(f"cannot reach a ready server at {args.server}: {exc.message}") from None
        if exc.code == "RESOURCE_EXHAUSTED" and "larger than max" in exc.message:
            raise CliError(
                f"a request was larger than the server takes ({exc.message}); send fewer texts "
                "per request with --batch-size"
            ) from None
        if exc.code == "UNAUTHENTICATED":
            raise CliError(
                f"the server refused the call: {exc.message} (give the token with --token-file "
                f"or ${connect.TOKEN_ENV})"
            ) from None
        raise CliError(str(exc)) from None
    except ValueError as exc:  # unusable TLS files or token, text that is not valid Unicode
        raise CliError(str(exc)) from None
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        doc = json_document(args, texts, pairs, predictions, model, version)
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        shown = texts
        if pairs is not None:
            shown = [f"{a} / {b}" for a, b in zip(texts, pairs, strict=True)]
        print(format_table(shown, predictions, args.all_scores, args.top_k))
        print(f"({model} version {version}, {len(texts)} texts)", file=sys.stderr)
    return 0
