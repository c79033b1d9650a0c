"""`textserve classify` on a token classifier: each text's entities, in a table or as JSON.

    textserve classify --model ner "Ada Lovelace met Charles Babbage in London."
    TEXT  ENTITY  SCORE   START  END  WORD
    0     PER     0.9981      0   12  Ada Lovelace
    ...

classify.run asks the server what the model is (GetModel's `task`) and comes here for a token
classifier, so one command serves both kinds; --aggregation picks transformers' strategy.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

TOKEN_TASK = "token-classification"


def is_token_model(client: Any, args: argparse.Namespace) -> bool:
    """Whether the model the request names is a token classifier (False when the server cannot
    say: an HTTP server, or an older one)."""
    get_model = getattr(client, "get_model", None)
    if get_model is None:
        return False
    return str(getattr(get_model(args.model, args.version), "task", "")) == TOKEN_TASK


def tag_all(client: Any, args: argparse.Namespace, requests: list[Sequence[str]]) -> dict[str, Any]:
    """Tag each request's texts in order; the --json document (model, version, per text)."""
    results: list[dict[str, Any]] = []
    model = version = None
    for chunk in requests:
        answer = client.tag(
            chunk,
            model=args.model,
            version=args.version,
            aggregation=args.aggregation or "",
            truncate=False if args.no_truncate else None,
        )
        model, version = answer.model, answer.model_version
        for text, result in zip(chunk, answer.results, strict=True):
            results.append(
                {
                    "text": text,
                    "entities": [
                        {
                            "label": e.label,
                            "score": e.score,
                            "word": e.word,
                            "start": e.start,
                            "end": e.end,
                        }
                        for e in result.entities
                    ],
                    "num_tokens": result.num_tokens,
                    "truncated": result.truncated,
                    "windows": result.windows,
                }
            )
    return {"model": model, "version": version, "results": results}


def format_entities(document: dict[str, Any]) -> str:
    """The table: one line per entity, with its text's position, label, score, offsets, word."""
    rows = [
        (str(i), e["label"], f"{e['score']:.4f}", str(e["start"]), str(e["end"]), e["word"])
        for i, result in enumerate(document["results"])
        for e in result["entities"]
    ]
    head = ("TEXT", "ENTITY", "SCORE", "START", "END", "WORD")
    widths = [max([len(h), *(len(r[k]) for r in rows)]) for k, h in enumerate(head[:-1])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  WORD"]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + "  " + r[-1]
              for r in rows]  # fmt: skip
    return "\n".join(lines)


def print_entities(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(format_entities(document))
