"""Shared pieces of the hostile-input tests (tests/integration/test_hardening_*input*.py): the
model run alone in-process as the reference answer, hypothesis strategies for hostile texts,
and the checks every example ends with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import onnxruntime
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from textserve.artifact import Manifest
from textserve.service.engine.handle import MAX_CHARS_PER_TOKEN, ModelHandle
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

MAX_TEXTS = 8  # texts per request on the test server: random shapes cross the limit often
TIMEOUT = 30.0  # seconds: a call that takes this long is a hang
MB = 1_000_000
GOOD = "a gripping, beautifully acted film"
FUZZ = settings(
    max_examples=60,
    deadline=None,  # a shared 2-core CI machine: timing belongs to benchmarks
    derandomize=True,  # the same examples on every run: CI failures reproduce
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


@dataclass
class Reference:
    """The model run alone, in-process: what the server must answer for a text."""

    tokenizer: Tokenizer
    session: onnxruntime.InferenceSession
    manifest: Manifest
    unk: int

    @property
    def max_chars(self) -> int:
        return MAX_CHARS_PER_TOKEN * self.manifest.max_length

    def ids(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text[: self.max_chars]).ids
        return ids[: self.manifest.max_length] or [self.unk]

    def too_long(self, text: str) -> bool:
        """Refused with truncate=false."""
        if len(text) > self.max_chars:
            return True
        return len(self.tokenizer.encode(text).ids) > self.manifest.max_length

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            ids = np.array([self.ids(text)], dtype=np.int64)
            (logits,) = self.session.run(
                ["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            )
            exp = np.exp(logits[0] - logits[0].max())
            rows.append(exp / exp.sum())
        return np.array(rows, dtype=np.float32)


def reference_for(handle: ModelHandle) -> Reference:
    """The reference for the version `handle` serves, from its files."""
    tokenizer = Tokenizer.from_file(str(handle.path / "tokenizer.json"))
    session = onnxruntime.InferenceSession(
        str(handle.path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return Reference(tokenizer, session, handle.manifest, tokenizer.token_to_id("[UNK]"))


def call(fn: Any, request: Any) -> tuple[grpc.StatusCode, Any, str]:
    try:
        return OK, fn(request, timeout=TIMEOUT), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""


def assert_still_serving(channel: grpc.Channel, reference: Reference) -> None:
    response = pb_grpc.ClassifierStub(channel).Classify(
        pb.ClassifyRequest(texts=[GOOD], all_scores=True), timeout=TIMEOUT
    )
    np.testing.assert_allclose(
        list(response.results[0].scores), reference.probabilities([GOOD])[0], atol=1e-5
    )


# -- strategies -----------------------------------------------------------------------------------


def _alphabet(*ranges: tuple[int, int]) -> st.SearchStrategy[str]:
    return st.one_of(*(st.characters(min_codepoint=a, max_codepoint=b) for a, b in ranges))


CONTROL = st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp"])  # incl. NUL, BOM, ZWJ, RLO
EMOJI = _alphabet((0x1F300, 0x1FAFF), (0x2600, 0x27BF), (0xFE0F, 0xFE0F), (0x200D, 0x200D))
RTL = _alphabet((0x0590, 0x05FF), (0x0600, 0x06FF), (0x202A, 0x202E), (0x2066, 0x2069))
COMBINING = _alphabet((0x0300, 0x036F), (0x0041, 0x005A))

texts_strategy = st.one_of(
    st.text(max_size=120),  # any Unicode but surrogates (which UTF-8 cannot carry)
    st.text(CONTROL, max_size=40),
    st.text(EMOJI, max_size=60),
    st.text(RTL, max_size=80),
    st.text(COMBINING, max_size=80),
    st.sampled_from(["", " ", "\t\n", "\u3000", "\x00", "\ufeff", "[PAD]", "[UNK] [UNK]"]),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(1, 5000)),  # one long "token"
    st.builds(" ".join, st.lists(st.sampled_from(GOOD.split()), max_size=200)),  # many tokens
)


# Non-blank texts: most examples must get past validation to test the answers.
content = texts_strategy.filter(lambda t: bool(t) and not t.isspace())
