#!/usr/bin/env python3
"""Converts a CTranslate2 Whisper model (`model.bin`) into whisper.cpp's ggml format.

    whisper_ct2_to_ggml.py CT2_MODEL_BIN TEMPLATE_GGML OUTPUT

CT2_MODEL_BIN  the weights: a CTranslate2 `WhisperSpec` model (binary version 5 or 6,
               float16 or float32 variables, not quantized).
TEMPLATE_GGML  a whisper.cpp ggml file of the same model size whose header, mel filters
               and vocabulary are taken as they are (whisper.cpp's
               `models/for-tests-ggml-*.bin` carry exactly these and no tensors).
OUTPUT         the ggml model written (to OUTPUT.partial first, renamed at the end).

Only numpy is needed. The layout written is that of whisper.cpp's
`models/convert-pt-to-ggml.py`: the header (magic 0x67676d6c and 11 int32
hyperparameters), the mel filters, the vocabulary, then one record per tensor
(`n_dims, len(name), ftype`, the dimensions innermost first, the name, the data).
Matrices and convolution kernels are float16; vectors, the convolution biases
(reshaped to [n, 1]) and both positional embeddings are float32, as whisper.cpp
declares them.

CTranslate2 names layers differently and fuses projections; the mapping is:

    encoder/conv{1,2}/{weight,bias}                 encoder.conv{1,2}.{weight,bias}
    encoder/position_encodings/encodings            encoder.positional_embedding
    encoder/layer_norm/{gamma,beta}                 encoder.ln_post.{weight,bias}
    decoder/embeddings/weight                       decoder.token_embedding.weight
    decoder/position_encodings/encodings            decoder.positional_embedding
    decoder/layer_norm/{gamma,beta}                 decoder.ln.{weight,bias}
    {enc,dec}oder/layer_N/self_attention/layer_norm  *.blocks.N.attn_ln
    {enc,dec}oder/layer_N/self_attention/linear_0    split in 3: *.attn.{query,key,value}
    {enc,dec}oder/layer_N/self_attention/linear_1    *.attn.out
    decoder/layer_N/attention/layer_norm            decoder.blocks.N.cross_attn_ln
    decoder/layer_N/attention/linear_0              decoder.blocks.N.cross_attn.query
    decoder/layer_N/attention/linear_1              split in 2: cross_attn.{key,value}
    decoder/layer_N/attention/linear_2              decoder.blocks.N.cross_attn.out
    {enc,dec}oder/layer_N/ffn/layer_norm            *.blocks.N.mlp_ln
    {enc,dec}oder/layer_N/ffn/linear_{0,1}          *.blocks.N.mlp.{0,2}

CTranslate2 fills the key projection's missing bias with zeros when it fuses; whisper.cpp
has no key bias, so that part is dropped (after checking it is zero: a non-zero key bias
would mean a model this mapping does not describe).
"""

import os
import re
import struct
import sys

import numpy as np

GGML_MAGIC = 0x67676D6C
# CTranslate2's DataType ids (include/ctranslate2/types.h).
CT2_DTYPES = {0: np.float32, 4: np.float16}
CT2_DTYPE_NAMES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
HPARAMS = (
    "n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
    "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype",
)


def fail(message):
    sys.stderr.write("whisper_ct2_to_ggml: error: %s\n" % message)
    sys.exit(1)


class Cursor:
    def __init__(self, data, what):
        self.data, self.pos, self.what = data, 0, what

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            fail("%s is truncated at byte %d (needs %d more)" % (self.what, self.pos, n))
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))

    def string(self):
        (n,) = self.unpack("H")
        return self.take(n).rstrip(b"\0").decode("utf-8")


def read_ct2(path):
    """The variables of a CTranslate2 model file: name -> numpy array (or scalar)."""
    with open(path, "rb") as f:
        c = Cursor(f.read(), path)
    (version,) = c.unpack("I")
    if version < 5 or version > 6:
        fail("%s: CTranslate2 binary version %d; only 5 and 6 are read" % (path, version))
    spec = c.string()
    c.unpack("I")  # spec revision
    if spec != "WhisperSpec":
        fail("%s is a CTranslate2 `%s`, not a `WhisperSpec`" % (path, spec))
    (count,) = c.unpack("I")
    variables = {}
    for _ in range(count):
        name = c.string()
        (rank,) = c.unpack("B")
        shape = c.unpack("%dI" % rank)
        dtype, nbytes = c.unpack("BI")
        raw = c.take(nbytes)
        if rank == 0:
            variables[name] = raw  # flags and scalars (num_heads, activation, ...)
            continue
        if dtype not in CT2_DTYPES:
            fail("%s: variable `%s` is %s; only float16/float32 models are converted "
                 "(not quantized ones)" % (path, name, CT2_DTYPE_NAMES.get(dtype, dtype)))
        array = np.frombuffer(raw, dtype=CT2_DTYPES[dtype])
        if array.size != int(np.prod(shape)):
            fail("%s: variable `%s` holds %d values for shape %s" % (path, name, array.size, shape))
        variables[name] = array.reshape(shape)
    (aliases,) = c.unpack("I")
    for _ in range(aliases):
        alias, target = c.string(), c.string()
        if target in variables:
            variables[alias] = variables[target]
    return variables


def read_template(path):
    """The template's hyperparameters and its header bytes up to the first tensor
    (hyperparameters, mel filters, vocabulary)."""
    with open(path, "rb") as f:
        c = Cursor(f.read(), path)
    (magic,) = c.unpack("I")
    if magic != GGML_MAGIC:
        fail("%s is not a whisper.cpp ggml file (magic 0x%08x)" % (path, magic))
    hparams = dict(zip(HPARAMS, c.unpack("11i")))
    n_mel, n_fft = c.unpack("2i")
    c.take(4 * n_mel * n_fft)
    (n_vocab,) = c.unpack("i")
    for _ in range(n_vocab):
        (length,) = c.unpack("I")
        c.take(length)
    return hparams, c.data[4:c.pos]


def tensors(v, hp):
    """(ggml name, array) in whisper.cpp's naming, from the CTranslate2 variables."""
    out = []

    def get(name):
        if name not in v:
            fail("the CTranslate2 model has no variable `%s`" % name)
        return v[name]

    def linear(src, dst):
        out.append((dst + ".weight", get(src + "/weight")))
        out.append((dst + ".bias", get(src + "/bias")))

    def norm(src, dst):
        out.append((dst + ".weight", get(src + "/gamma")))
        out.append((dst + ".bias", get(src + "/beta")))

    def fused(src, dst, parts):
        weight, bias = get(src + "/weight"), get(src + "/bias")
        if weight.shape[0] % len(parts) or bias.shape[0] != weight.shape[0]:
            fail("`%s` (%s) does not split into %d projections" % (src, weight.shape, len(parts)))
        for part, w, b in zip(parts, np.split(weight, len(parts)), np.split(bias, len(parts))):
            out.append(("%s.%s.weight" % (dst, part), w))
            if part == "key":
                if np.any(b != 0):
                    fail("`%s` has a non-zero key bias; whisper.cpp has none" % src)
            else:
                out.append(("%s.%s.bias" % (dst, part), b))

    def block(side, n, dst):
        src = "%s/layer_%d" % (side, n)
        norm(src + "/self_attention/layer_norm", dst + ".attn_ln")
        fused(src + "/self_attention/linear_0", dst + ".attn", ["query", "key", "value"])
        linear(src + "/self_attention/linear_1", dst + ".attn.out")
        if side == "decoder":
            norm(src + "/attention/layer_norm", dst + ".cross_attn_ln")
            linear(src + "/attention/linear_0", dst + ".cross_attn.query")
            fused(src + "/attention/linear_1", dst + ".cross_attn", ["key", "value"])
            linear(src + "/attention/linear_2", dst + ".cross_attn.out")
        norm(src + "/ffn/layer_norm", dst + ".mlp_ln")
        linear(src + "/ffn/linear_0", dst + ".mlp.0")
        linear(src + "/ffn/linear_1", dst + ".mlp.2")

    out.append(("encoder.positional_embedding", get("encoder/position_encodings/encodings")))
    linear("encoder/conv1", "encoder.conv1")
    linear("encoder/conv2", "encoder.conv2")
    for n in range(hp["n_audio_layer"]):
        block("encoder", n, "encoder.blocks.%d" % n)
    norm("encoder/layer_norm", "encoder.ln_post")
    out.append(("decoder.positional_embedding", get("decoder/position_encodings/encodings")))
    out.append(("decoder.token_embedding.weight", get("decoder/embeddings/weight")))
    for n in range(hp["n_text_layer"]):
        block("decoder", n, "decoder.blocks.%d" % n)
    norm("decoder/layer_norm", "decoder.ln")

    # Every layer the model has is converted: one more than the template says is a
    # different model, not a smaller one.
    for side, key in (("encoder", "n_audio_layer"), ("decoder", "n_text_layer")):
        extra = "%s/layer_%d/ffn/linear_0/weight" % (side, hp[key])
        if extra in v:
            fail("the CTranslate2 model has more %s layers than the template's %s=%d"
                 % (side, key, hp[key]))
    return out


def expected_shape(name, hp):
    """The shape (outermost first) whisper.cpp declares for a tensor."""
    a, t = hp["n_audio_state"], hp["n_text_state"]
    if name == "encoder.positional_embedding":
        return (hp["n_audio_ctx"], a)
    if name == "decoder.positional_embedding":
        return (hp["n_text_ctx"], t)
    if name == "decoder.token_embedding.weight":
        return (hp["n_vocab"], t)
    if name == "encoder.conv1.weight":
        return (a, hp["n_mels"], 3)
    if name == "encoder.conv2.weight":
        return (a, a, 3)
    if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
        return (a, 1)
    s = a if name.startswith("encoder.") else t
    if re.search(r"\.mlp\.0\.weight$", name):
        return (4 * s, s)
    if re.search(r"\.mlp\.0\.bias$", name):
        return (4 * s,)
    if re.search(r"\.mlp\.2\.weight$", name):
        return (s, 4 * s)
    if name.endswith(".weight") and re.search(r"\.(query|key|value|out)\.weight$", name):
        return (s, s)
    return (s,)


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[0] + "\n")
        sys.exit(2)
    ct2_path, template_path, out_path = argv[1:4]
    hp, header = read_template(template_path)
    if hp["ftype"] != 1:
        fail("%s has ftype %d; the template must be a float16 one (ftype 1)" % (template_path, hp["ftype"]))
    variables = read_ct2(ct2_path)
    for key, value in (("decoder/num_heads", hp["n_text_head"]), ("encoder/num_heads", hp["n_audio_head"])):
        raw = variables.get(key)
        if raw is not None and int.from_bytes(raw, "little") != value:
            fail("the CTranslate2 model has %s=%d, the template %d" % (key, int.from_bytes(raw, "little"), value))

    part = out_path + ".partial"
    with open(part, "wb") as f:
        f.write(struct.pack("<I", GGML_MAGIC))
        f.write(header)
        for name, data in tensors(variables, hp):
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(data.shape[0], 1)
            want = expected_shape(name, hp)
            if tuple(data.shape) != want:
                fail("`%s` has shape %s; whisper.cpp expects %s" % (name, tuple(data.shape), want))
            small = data.ndim < 2 or name in (
                "encoder.conv1.bias", "encoder.conv2.bias",
                "encoder.positional_embedding", "decoder.positional_embedding")
            data = np.ascontiguousarray(data, dtype="<f4" if small else "<f2")
            encoded = name.encode("utf-8")
            f.write(struct.pack("<3i", data.ndim, len(encoded), 0 if small else 1))
            f.write(struct.pack("<%di" % data.ndim, *reversed(data.shape)))
            f.write(encoded)
            f.write(data.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, out_path)


if __name__ == "__main__":
    main(sys.argv)
