"""``transformer_lm``: a decoder-only Transformer language model (GPT-2 / nanoGPT layout), for `tasks.lm`.

Not in the registry: a registered builder maps (input_shape, num_classes) to logits [B, C], and a language
model maps token ids [B, T] to logits [B, T, vocab]. Build it with ``transformer_lm(...)``.

    model = transformer_lm(vocab_size=65, layers=4, heads=4, width=128, context=64)
    logits = model(ids)                  # ids int32 [B, T], T <= context: every position real
    logits = model((ids, lengths))       # lengths int32 [B]: positions >= length are padding
    logits, cache = model.cached_call(ids, 0, model.empty_cache(batch))  # positions 0 .. T-1, keys kept
    logits, cache = model.cached_call(next_ids, T, cache)                # [B, 1]: one position's compute

Layout: token embedding (+ learned positions, or rotary positions applied to queries and keys), ``layers``
pre-LayerNorm blocks (causal self-attention, then a GELU MLP of 4x width), a final LayerNorm and an untied
linear head without bias (nanoGPT ties the head to the embedding; untied keeps each variable one layer's).
Attention is this module's own: rotary positions act between the projection and the scores, which
``keras.layers.MultiHeadAttention`` does not expose. A padding key is never attended to, so the logits at
real positions do not depend on what padding holds. Logits are float32 whatever the dtype policy (under
mixed precision the blocks compute in 16 bits; the head's output is cast, as the trainer does for the
registry's models).

The model knows nothing of tensor parallelism: it is split from outside by its plan, ``tensor_plan``
(`models.layout`: the embedding and the head by vocabulary, each block's attention by heads, its MLP by columns
then rows), as any model a user brings. Split by vocabulary, the head gives a tuple of vocabulary shards
(`models.vocab_shards`: ``cross_entropy``, ``argmax`` and ``whole`` take either form).

``cached_call`` is the incremental path of generation (tasks/lm_generate.py): the keys and values of earlier
positions are kept per block in a cache of ``context`` positions, so a new position costs one position's
projections and MLP, and attention over the positions up to it. It computes ``call``'s ops at those positions
on the same real keys (no padding), for learned and rotary positions: the same logits to float32 rounding (a
LayerNorm or matmul over one row may round otherwise than over T rows).
"""

from __future__ import annotations

import keras
from keras import layers, ops

from models import vocab_shards
from models.common import NamedDropout
from models.registry import ModelError
from models.stages import Piece

POSITIONS = ("learned", "rotary")
_MASKED = -1e9  # added to a masked score in float32; exp() of it is 0, and a row never is all masked


def transformer_lm(
    vocab_size: int,
    layers: int = 4,
    heads: int = 4,
    width: int = 128,
    context: int = 64,
    positions: str = "learned",
    dropout: float = 0.0,
) -> keras.Model:
    """Builds the language model (its variables exist).

    Args:
      vocab_size: Tokens in the vocabulary (logits per position).
      layers: Transformer blocks.
      heads: Attention heads per block; must divide ``width`` (and leave an even head size for rotary).
      width: The residual stream's size (embedding dimension); the MLP is 4x this.
      context: The longest sequence the model takes (learned positions have this many rows).
      positions: "learned" (absolute embeddings, GPT-2) or "rotary" (RoPE on queries and keys, no weights).
      dropout: Dropout rate after attention weights, each residual branch and the embeddings (training only).

    Returns:
      A built ``TransformerLM``: ids int32 [B, T] or (ids, lengths int32 [B]) -> logits float32 [B, T, vocab].

    Raises:
      ModelError: For a size that is not positive, heads not dividing width, an odd rotary head size, an
        unknown ``positions``, or a dropout rate outside [0, 1).
    """
    _check_sizes(vocab_size, layers, heads, width, context, positions, dropout)
    model = TransformerLM(vocab_size, layers, heads, width, context, positions, dropout, name="transformer_lm")
    length = min(2, context)  # 1 token would make Keras warn about a softmax over one value
    model((ops.zeros((1, length), "int32"), ops.full((1,), length, "int32")))  # creates the variables
    return model


def parameter_count(vocab_size: int, layers: int, width: int, context: int, positions: str) -> int:
    """The number of weights ``transformer_lm`` makes: embedding V*W, learned positions C*W, per block
    12*W^2 + 13*W (q, k, v, out projections with biases; the MLP's two; two LayerNorms), the final LayerNorm
    2*W and the head W*V."""
    position_weights = context * width if positions == "learned" else 0
    return 2 * vocab_size * width + position_weights + layers * (12 * width * width + 13 * width) + 2 * width


def _check_sizes(vocab_size, layers_, heads, width, context, positions, dropout) -> None:
    sizes = {"vocab_size": vocab_size, "layers": layers_, "heads": heads, "width": width, "context": context}
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ModelError(f"transformer_lm: {name} ({value!r}) must be a positive integer")
    if positions not in POSITIONS:
        raise ModelError(f"transformer_lm: positions {positions!r} must be one of {', '.join(POSITIONS)}")
    if width % heads:
        raise ModelError(f"transformer_lm: heads ({heads}) must divide width ({width})")
    if positions == "rotary" and (width // heads) % 2:
        raise ModelError(f"transformer_lm: rotary positions need an even head size; width/heads = {width // heads}")
    if not 0 <= dropout < 1:
        raise ModelError(f"transformer_lm: dropout ({dropout}) must be in [0, 1)")


@keras.saving.register_keras_serializable(package="towerflow")
class TransformerLM(keras.Model):
    """The decoder-only Transformer; see the module docstring. Build it with ``transformer_lm``."""

    tensor_plan = (  # how `models.layout` splits it over tensor-parallel shards
        ("token_embedding", "vocabulary"),
        (r"block_\d+/attention", "heads"),
        (r"block_\d+/mlp_in", "column"),
        (r"block_\d+/mlp_out", "row"),
        ("head", "vocabulary"),
    )

    def __init__(self, vocab_size, layers_, heads, width, context, positions, dropout, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.context, self.positions = vocab_size, context, positions
        self.token_embedding = layers.Embedding(vocab_size, width, name="token_embedding")
        self.position_embedding = (
            layers.Embedding(context, width, name="position_embedding") if positions == "learned" else None
        )
        self.embedding_dropout = NamedDropout(dropout, name="embedding_dropout")
        rotary = positions == "rotary"
        self.blocks = [Block(heads, width, dropout, rotary, name=f"block_{i}") for i in range(layers_)]
        self.final_norm = layers.LayerNormalization(epsilon=1e-5, name="final_norm")
        self.head = layers.Dense(vocab_size, use_bias=False, name="head")

    def call(self, inputs, training=False):
        for piece in self.pipeline_pieces():
            inputs = piece.call(inputs, training)
        return inputs

    def pipeline_pieces(self) -> list[Piece]:
        """The places a pipeline may cut this model (`models.stages`): the embedding ((ids, lengths) -> (x,
        mask)), each block ((x, mask) -> (x, mask)), the final norm and head ((x, mask) -> logits). `call` runs
        these same pieces, so a cut computes exactly the ops of the whole model."""
        embedding = (self.token_embedding, self.position_embedding, self.embedding_dropout)
        blocks = [Piece(block.name, _block_call(block), (block,)) for block in self.blocks]
        return [
            Piece("embedding", self._embed, tuple(layer for layer in embedding if layer is not None)),
            *blocks,
            Piece("head", self._head, (self.final_norm, self.head)),
        ]

    def _embed(self, inputs, training):
        ids, lengths = inputs if isinstance(inputs, (tuple, list)) else (inputs, None)
        length = ops.shape(ids)[1]
        if isinstance(length, int) and length > self.context:
            raise ModelError(f"transformer_lm: {length} tokens exceed the context ({self.context})")
        x = ops.cast(self.token_embedding(ids), self.compute_dtype)
        if self.position_embedding is not None:
            x = x + ops.cast(self.position_embedding(ops.arange(length)), self.compute_dtype)[None]
        return self.embedding_dropout(x, training=training), attention_mask(length, lengths)

    def empty_cache(self, batch_size: int = 1) -> tuple:
        """The cache ``cached_call`` starts from: per block (keys, values), zeros [batch, heads, context,
        head_size] in the compute dtype."""
        attention = self.blocks[0].attention
        shape = (batch_size, attention.heads, self.context, attention.head_size)
        return tuple((ops.zeros(shape, self.compute_dtype), ops.zeros(shape, self.compute_dtype)) for _ in self.blocks)

    def cached_call(self, ids, start, cache):
        """Logits float32 [B, T, vocab] of ids [B, T] at positions start .. start + T - 1, every position real,
        given ``cache`` holding the keys and values of positions < start; inference only (no dropout).

        Returns (logits, the cache with these positions' keys and values written). Needs start + T <= context:
        positions do not slide (a learned position has its own row, and every later key depends on the first)."""
        positions = start + ops.arange(ops.shape(ids)[1])
        x = ops.cast(self.token_embedding(ids), self.compute_dtype)
        if self.position_embedding is not None:
            x = x + ops.cast(self.position_embedding(positions), self.compute_dtype)[None]
        mask = (ops.arange(start + ops.shape(ids)[1])[None, :] <= positions[:, None])[None, None]  # [1, 1, T, keys]
        kept = []
        for block, pair in zip(self.blocks, cache, strict=True):
            x, pair = block.cached_call(x, mask, positions, pair)
            kept.append(pair)
        return vocab_shards.whole(self._head((x,), False), self.vocab_size), tuple(kept)

    def _head(self, carried, training):
        logits = self.head(self.final_norm(carried[0]))  # a tuple of float32 vocabulary shards when sharded
        return logits if isinstance(logits, tuple) else ops.cast(logits, "float32")


def _block_call(block):
    def call(carried, training):
        x, mask = carried
        return block(x, mask, training=training), mask

    return call


def attention_mask(length, lengths=None):
    """Which keys each query may see: bool [1 or B, 1, T, T], True where key <= query and key < length.

    A query at a padding position still sees the real keys before it, so no row is empty (length >= 1)."""
    positions = ops.arange(length)
    causal = positions[None, :] <= positions[:, None]  # [query, key]
    if lengths is None:
        return causal[None, None]
    real_keys = positions[None, :] < ops.cast(lengths, "int32")[:, None]  # [B, key]
    return ops.logical_and(causal[None, None], real_keys[:, None, None, :])


class Block(layers.Layer):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) (pre-LayerNorm, as GPT-2)."""

    def __init__(self, heads, width, dropout, rotary, **kwargs):
        super().__init__(**kwargs)
        self.attention_norm = layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        self.attention = CausalSelfAttention(heads, width, dropout, rotary, name="attention")
        self.mlp_norm = layers.LayerNormalization(epsilon=1e-5, name="mlp_norm")
        self.mlp_in = layers.Dense(4 * width, activation="gelu", name="mlp_in")
        self.mlp_out = layers.Dense(width, name="mlp_out")
        self.mlp_dropout = NamedDropout(dropout, name="mlp_dropout")

    def call(self, x, mask, training=False):
        x = x + self.attention(self.attention_norm(x), mask, training=training)
        return x + self.mlp_dropout(self._mlp(x), training=training)

    def cached_call(self, x, mask, positions, cache):
        """``call`` at ``positions`` (inference), attending to the cached keys too; returns (x, cache)."""
        attended, cache = self.attention.cached_call(self.attention_norm(x), mask, positions, cache)
        x = x + attended
        return x + self._mlp(x), cache

    def _mlp(self, x):
        return self.mlp_out(self.mlp_in(self.mlp_norm(x)))


class CausalSelfAttention(layers.Layer):
    """Multi-head self-attention with a given key mask; rotary positions on queries and keys if asked.

    Split by heads (`models.split_attention`), shard k of N is ``heads_shard(N, k)``: this layer over heads
    [k*heads/N, (k+1)*heads/N), its output projection without the bias and no output dropout (the split layer
    adds the bias once to the shards' sum, then applies ``output_dropout``)."""

    def __init__(self, heads, width, dropout, rotary, head_size=None, whole=True, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.width, self.rotary, self.dropout = heads, width, rotary, dropout
        self.head_size = head_size or width // heads
        inner = heads * self.head_size
        self.query = layers.Dense(inner, name="query")
        self.key = layers.Dense(inner, name="key")
        self.value = layers.Dense(inner, name="value")
        self.output_projection = layers.Dense(width, use_bias=whole, name="output")
        self.weights_dropout = NamedDropout(dropout, name="weights_dropout")
        self.output_dropout = NamedDropout(dropout if whole else 0.0, name="output_dropout")

    def build(self, x_shape, mask_shape=None):
        """The projections and dropouts, in the order a first call makes them (so a model's bits do not depend
        on whether it was built by a call or here)."""
        del mask_shape
        for projection in (self.query, self.key, self.value):
            projection.build(x_shape)
        self.weights_dropout.build(None)
        self.output_projection.build((*x_shape[:-1], self.heads * self.head_size))
        self.output_dropout.build(None)

    def heads_shard(self, shards: int, k: int) -> CausalSelfAttention:
        """Shard k of ``shards`` by heads, built (its weights set by the caller, `models.split_attention`)."""
        part = CausalSelfAttention(
            self.heads // shards,
            self.width,
            self.dropout,
            self.rotary,
            self.head_size,
            whole=False,
            name=f"{self.name}_shard_{k}",
        )
        part.build((None, None, self.width))
        return part

    def call(self, x, mask, training=False):
        return self._output(self._attend(*self._project(x), mask, training), training)

    def cached_call(self, x, mask, positions, cache):
        """Attention of x [B, T, W] at ``positions`` (consecutive, from start) over the cached keys and values
        of the positions before and its own; returns (output, the cache [B, heads, context, head_size] with
        these positions' keys and values written). Only the real keys (start + T) enter the scores."""
        q, k, v = self._project(x, positions)
        start, end = positions[0], positions[-1] + 1
        keys, values = (
            ops.concatenate([old[:, :, :start], new, old[:, :, end:]], axis=2)
            for old, new in zip(cache, (k, v), strict=True)
        )
        return self._output(self._attend(q, keys[:, :, :end], values[:, :, :end], mask, False), False), (keys, values)

    def _project(self, x, positions=None):
        """q, k, v [B, heads, T, head_size]."""
        q, k, v = (self._heads(projection(x)) for projection in (self.query, self.key, self.value))
        if self.rotary:
            q, k = rotary(q, positions), rotary(k, positions)
        return q, k, v

    def _attend(self, q, k, v, mask, training):
        """The attended values [B, T, heads x head_size], before the output projection."""
        scores = ops.einsum("bhqd,bhkd->bhqk", q, k) * (self.head_size**-0.5)  # (B, nh, T, T)
        # Softmax in float32 (mixed precision): 16-bit scores lose the small weights.
        scores = ops.where(mask, ops.cast(scores, "float32"), _MASKED)
        weights = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        weights = self.weights_dropout(weights, training=training)
        out = ops.einsum("bhqk,bhkd->bqhd", weights, v)  # (B, T, nh, hs)
        return ops.reshape(out, (ops.shape(out)[0], ops.shape(out)[1], q.shape[1] * self.head_size))

    def _output(self, attended, training):
        return self.output_dropout(self.output_projection(attended), training=training)

    def _heads(self, x):
        shape = ops.shape(x)
        return ops.transpose(ops.reshape(x, (shape[0], shape[1], self.heads, self.head_size)), (0, 2, 1, 3))


def rotary(x, positions=None, base: float = 10000.0):
    """Rotary position embedding (RoPE, GPT-NeoX's half-split form) of x [B, heads, T, head_size] at
    ``positions`` int32 [T] (None: 0 .. T-1): the pair (x[i], x[i + d/2]) at position t is turned by the angle
    t * base^(-2i/d), so q.k depends on the offset."""
    half = x.shape[-1] // 2
    inverse = ops.power(base, -ops.arange(half, dtype="float32") * (2.0 / x.shape[-1]))
    positions = ops.arange(ops.shape(x)[2]) if positions is None else positions
    angles = ops.cast(positions, "float32")[:, None] * inverse[None, :]  # (T, d/2)
    cos, sin = (ops.cast(f(angles), x.dtype) for f in (ops.cos, ops.sin))
    first, second = x[..., :half], x[..., half:]
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
