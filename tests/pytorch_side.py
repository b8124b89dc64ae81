"""Runs in the tests' PyTorch environment (tests/pytorch_env.py), never in the project's: loads a saved model as a
transformers 5 user would and answers with what it got, as one JSON line on stdout.

The request (JSON on stdin): ``model`` (a folder or a Hub repository id), and optionally ``batch``
(``input_ids``, ``attention_mask``) for logits and the encoder's hidden states, ``sentences`` and ``top_k``
for fill-mask predictions, ``save_new`` (a folder) to answer for a model PyTorch makes from ``model``'s config and
saves there itself, as a PyTorch user's model is saved (in ``save_dtype``, float32 unless given).
"""

import json
import sys

import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, pipeline


def loading_report(info: dict) -> dict:
    return {key: sorted(map(str, info.get(key, []))) for key in ("missing_keys", "unexpected_keys", "mismatched_keys")}


def main() -> None:
    request = json.loads(sys.stdin.read())
    if "save_new" in request:
        torch.manual_seed(0)
        made = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(request["model"]))
        made.to(getattr(torch, request.get("save_dtype", "float32"))).save_pretrained(request["save_new"])
        request["model"] = request["save_new"]
    model, info = AutoModelForMaskedLM.from_pretrained(request["model"], output_loading_info=True)
    model.eval()
    encoder, encoder_info = AutoModel.from_pretrained(
        request["model"], add_pooling_layer=False, output_loading_info=True
    )
    encoder.eval()
    answer = {
        "class": type(model).__name__,
        "loading": loading_report(info),
        "encoder_class": type(encoder).__name__,
        "encoder_loading": loading_report(encoder_info),
        "decoder_tied": model.get_output_embeddings().weight.data_ptr()
        == model.get_input_embeddings().weight.data_ptr(),
        "dtype": str(next(model.parameters()).dtype),
    }
    if "batch" in request:
        batch = {key: torch.tensor(value) for key, value in request["batch"].items()}
        with torch.no_grad():
            answer["logits"] = model(**batch).logits.tolist()
            answer["hidden"] = encoder(**batch).last_hidden_state.tolist()
    if request.get("sentences"):
        fill = pipeline("fill-mask", model=request["model"])
        answer["fill_mask"] = [
            [{"token": p["token_str"], "score": p["score"]} for p in fill(sentence, top_k=request["top_k"])]
            for sentence in request["sentences"]
        ]
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
