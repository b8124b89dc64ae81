"""The trained model in PyTorch's layout, beside the TF weights, so that transformers 5 (PyTorch only),
sentence-transformers and ONNX exporters load it as it is; and loading the TF weights back without the trap
that layout sets for transformers 4.57.

``write_pytorch_weights`` converts the TF model's variables with numpy alone (no torch anywhere): each TF
name becomes the PyTorch state-dict name by transformers 4.57's own TF-to-PyTorch rules
(``roberta/encoder/layer_._0/attention/self/query/kernel:0`` -> ``roberta.encoder.layer.0.attention.self.
query.weight``), Dense kernels are transposed (TF ``(in, out)``, PyTorch ``(out, in)``), and every weight
is stored in float32, whatever precision trained it. The LM head's decoder is the word embeddings in both
frameworks, so it is not stored twice: PyTorch ties it on loading, as its own ``save_pretrained`` expects.
A model above ``MAX_SHARD_BYTES`` is split into ``model-0000K-of-0000N.safetensors`` files with the
``model.safetensors.index.json`` the Hub and transformers read.

The trap: with such a ``model.safetensors`` beside ``tf_model.h5``, transformers 4.57's TF loading picks
the safetensors file and fails (``TypeError: 'builtins.safe_open' object is not iterable``). Every TF load
in this project goes through :data:`TF_LOADING`, which keeps it on ``tf_model.h5``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.tokenization import TOKENIZER_FILE, fingerprint

log = logging.getLogger("tpu_mlm.pytorch_weights")

TF_WEIGHTS_FILE = "tf_model.h5"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_PATTERN = "model{suffix}.safetensors"  # huggingface_hub's shard names: model-00001-of-00002.safetensors
# 5 GB, huggingface_hub's default shard size (and transformers 4's): the largest preset, roberta-large, is 1.4 GB
# in float32 and stays one file; a model big enough to shard downloads in resumable, parallel parts.
MAX_SHARD_BYTES = 5 * 10**9
# A LayerNorm's weight and bias as PyTorch checkpoints before its renaming name them
LEGACY_NAMES = {"weight": ("gamma",), "bias": ("beta",)}
# The masked-LM head's bias, which PyTorch ties to its decoder's: a checkpoint may hold it under that name alone
TIED_NAMES = {"lm_head.bias": ("lm_head.decoder.bias",), "cls.predictions.bias": ("cls.predictions.decoder.bias",)}
# What every TF load of a model folder or Hub repository passes: the TF weights, never model.safetensors.
TF_LOADING = {"use_safetensors": False}


def save_model_folder(model: Any, tokenizer: Any, folder: Path) -> None:
    """A model folder as every model the project saves is: config and TF weights (``save_pretrained``), the
    PyTorch weights, and the tokenizer."""
    model.save_pretrained(folder)
    write_pytorch_weights(model, folder)
    tokenizer.save_pretrained(folder)


def pytorch_state_dict(model: Any) -> dict[str, Any]:
    """The TF model's weights under their PyTorch state-dict names and layouts, as float32 numpy arrays."""
    import numpy as np
    from transformers.modeling_tf_pytorch_utils import TransposeType, convert_tf_weight_name_to_pt_weight_name

    state: dict[str, Any] = {}
    for variable in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(variable.name, tf_weight_shape=variable.shape)
        if transpose not in (TransposeType.NO, TransposeType.SIMPLE):
            raise ValueError(f"{variable.name}: no conversion for {transpose.value} weights (only dense layers)")
        if name in state:
            raise ValueError(f"{variable.name}: a second weight named {name}")
        value = np.asarray(variable.numpy(), dtype=np.float32)
        state[name] = np.ascontiguousarray(value.T if transpose is TransposeType.SIMPLE else value)
    return state


def read_pytorch_weights(model: Any, folder: Path, parameter: str, uri: str) -> list[str]:
    """Sets the built TF model's weights from the PyTorch weights in ``folder`` (``model.safetensors`` or its
    shards; a local copy of ``uri``), numpy only: the inverse of ``pytorch_state_dict``, each TF variable read
    under its PyTorch name by the same rules, Dense kernels transposed back (bfloat16 ones widened to float32,
    exactly). Returns the PyTorch names of the weights the files lack (left as the model was built); a weight of
    another shape is refused naming ``parameter``."""
    import numpy as np
    from safetensors import safe_open
    from transformers.modeling_tf_pytorch_utils import TransposeType, convert_tf_weight_name_to_pt_weight_name

    stored: dict[str, Path] = {}
    for file in pytorch_weight_files(folder):
        if file.name != WEIGHTS_INDEX_FILE:
            with safe_open(file, framework="np") as weights:
                stored |= dict.fromkeys(weights.keys(), file)
    missing = []
    for variable in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(variable.name, tf_weight_shape=variable.shape)
        # checkpoints saved before PyTorch's LayerNorm renaming hold gamma and beta
        owner, _, last = name.rpartition(".")
        legacy = [f"{owner}.{old}" for old in LEGACY_NAMES.get(last, ())]
        found = next((key for key in (name, *legacy, *TIED_NAMES.get(name, ())) if key in stored), None)
        if found is None:
            missing.append(name)
            continue
        with safe_open(stored[found], framework="np") as weights:
            try:
                value = weights.get_tensor(found)
            except TypeError:  # numpy has no bfloat16
                value = bfloat16_tensor(stored[found], found)
        value = value.T if transpose is TransposeType.SIMPLE else value
        if tuple(value.shape) != tuple(variable.shape):
            raise InvalidParameter(
                parameter, uri, f"stores {found} of shape {tuple(value.shape)}, its config {tuple(variable.shape)}"
            )
        variable.assign(np.asarray(value, dtype=variable.dtype.as_numpy_dtype))
    return missing


def bfloat16_tensor(file: Path, name: str) -> Any:
    """The bfloat16 tensor ``name`` of the safetensors ``file`` as float32, which holds every bfloat16 exactly: its
    bits are a float32's upper half. Read from the format's own layout (an 8-byte little-endian header length, a
    JSON header of each tensor's dtype, shape and byte offsets, then the data), since numpy has no bfloat16."""
    import numpy as np

    with open(file, "rb") as weights:
        header_bytes = int.from_bytes(weights.read(8), "little")
        entry = json.loads(weights.read(header_bytes))[name]
        if entry["dtype"] != "BF16":
            raise ValueError(f"{file.name}: {name} is {entry['dtype']}, which numpy reads itself")
        start, end = entry["data_offsets"]
        weights.seek(8 + header_bytes + start)
        raw = np.frombuffer(weights.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def write_pytorch_weights(model: Any, folder: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Writes the model's PyTorch weights into ``folder`` (one file, or shards and their index); returns the
    names written. Removes any PyTorch weights of an earlier conversion first, so the folder never holds two."""
    from huggingface_hub.serialization import split_state_dict_into_shards_factory
    from safetensors.numpy import save_file

    state = pytorch_state_dict(model)
    split = split_state_dict_into_shards_factory(
        state,
        get_storage_size=lambda array: array.nbytes,
        filename_pattern=WEIGHTS_PATTERN,
        max_shard_size=max_shard_bytes,
    )
    for stale in pytorch_weight_files(folder):
        stale.unlink()
    for filename, names in split.filename_to_tensors.items():
        save_file({name: state[name] for name in names}, folder / filename, metadata={"format": "pt"})
    written = sorted(split.filename_to_tensors)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (folder / WEIGHTS_INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(WEIGHTS_INDEX_FILE)
    log.info("PyTorch weights: %d tensors in %s", len(state), ", ".join(written))
    return written


def pytorch_weight_files(folder: Path) -> list[Path]:
    """The PyTorch weight files in ``folder``: ``model.safetensors``, or shards and their index."""
    return sorted(folder.glob("model*.safetensors")) + sorted(folder.glob(WEIGHTS_INDEX_FILE))


def add_pytorch_weights(folder: Path, parameter: str, uri: str) -> list[str]:
    """Writes the PyTorch weights of the TF model in the local model folder ``folder`` (a copy of ``uri``)
    beside its TF weights, and makes its config name the PyTorch class; returns the weight files written.
    Running it again writes the same bytes."""
    model = load_tf_masked_lm(folder, parameter, uri)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    architecture = type(model).__name__.removeprefix("TF")  # TFRobertaForMaskedLM -> RobertaForMaskedLM
    if config.get("architectures") != [architecture]:
        config["architectures"] = [architecture]
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return write_pytorch_weights(model, folder)


def check_model_folder(parameter: str, uri: str) -> None:
    """Refuses, naming ``parameter``, a folder (local or gs://) that holds no saved model."""
    if not storage.exists(storage.join(uri, "config.json")):
        raise InvalidParameter(parameter, uri, "is not a saved model folder (no config.json in it)")


def load_tf_masked_lm(folder: Path, parameter: str, uri: str) -> Any:
    """The TF masked-LM model of the local copy ``folder`` of the model folder ``uri``, from its TF weights;
    a folder without them is refused, naming ``parameter``."""
    from transformers import TFAutoModelForMaskedLM

    if not (folder / TF_WEIGHTS_FILE).exists():
        raise InvalidParameter(parameter, uri, f"holds no TF model weights ({TF_WEIGHTS_FILE})")
    return TFAutoModelForMaskedLM.from_pretrained(folder, **TF_LOADING)


def load_model(uri: str, local_dir: Path, parameter: str = "model", strategy: Any = None) -> tuple[Any, Any, str]:
    """Model (in ``strategy``'s scope when given), tokenizer and tokenizer fingerprint of a saved model folder
    (local or gs://)."""
    from transformers import AutoTokenizer

    check_model_folder(parameter, uri)
    storage.download_folder(uri, local_dir)
    if not (local_dir / TOKENIZER_FILE).exists():
        raise InvalidParameter(parameter, uri, f"holds no tokenizer ({TOKENIZER_FILE}) beside the model")
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = load_tf_masked_lm(local_dir, parameter, uri)
    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    return model, tokenizer, fingerprint((local_dir / TOKENIZER_FILE).read_bytes())
