"""The shard set's format: ``<split>-<part>-<index>-<records>.tfrecord`` files, one part manifest per part
under ``parts/``, and ``manifest.json``, written last, which says the set is complete and what made it."""

from __future__ import annotations

import json
import logging
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter

log = logging.getLogger("tpu_mlm.shards")

MANIFEST = "manifest.json"
PARTS_FOLDER = "parts"


def part_manifest_uri(output: str, part: int, num_parts: int) -> str:
    return storage.join(output, PARTS_FOLDER, f"{part:05d}-of-{num_parts:05d}.json")


def merge_manifests(output: str) -> dict[str, Any]:
    """Checks that every part of a sharded run is there with the same settings and writes ``manifest.json``."""
    storage.check_uri("output", output)
    uris = storage.glob(storage.join(output, PARTS_FOLDER, "*-of-*.json"))
    if not uris:
        raise InvalidParameter("output", output, "holds no part manifests (parts/*.json); run components.shards first")
    parts = [json.loads(storage.read_text(uri)) for uri in uris]
    first = parts[0]
    settings_keys = [key for key in first if key not in PART_KEYS]
    for part in parts[1:]:
        differing = [key for key in settings_keys if part.get(key) != first[key]]
        if differing:
            raise InvalidParameter("output", output, f"holds parts made with different settings: {differing}")
    found = sorted(part["part"] for part in parts)
    missing = sorted(set(range(first["num_parts"])) - set(found))
    if missing:
        raise InvalidParameter("output", output, f"is missing parts {missing} of {first['num_parts']}")
    files = [file for part in sorted(parts, key=lambda p: p["part"]) for file in part["files"]]
    verify_files(output, {"files": files}, "output", listed_in="its part manifest")
    manifest = {key: first[key] for key in settings_keys}
    manifest["files"] = files
    manifest.update({key: sum(part.get(key, 0) for part in parts) for key in SUMMED_KEYS})
    if all("token_counts" in part for part in parts):  # parts written before the counts were kept have none
        manifest["token_counts"] = [
            sum(counts) for counts in zip(*(part["token_counts"] for part in parts), strict=True)
        ]
    if manifest["num_records"] == 0:
        raise InvalidParameter("output", output, "the parts hold no samples: the corpus is shorter than one sample")
    storage.remove_temporaries(storage.join(output, MANIFEST))
    storage.write_text_atomic(storage.join(output, MANIFEST), dumps(manifest))
    log.info("%s: %d samples in %d files", storage.join(output, MANIFEST), manifest["num_records"], len(files))
    return manifest


def gather_parts(part_folders: list[str], output: str) -> dict[str, Any]:
    """Copies the shards and part manifests of parts written to separate folders (one per pipeline task)
    into ``output`` and merges them there. On ``gs://`` the copies are server-side."""
    storage.check_uri("output", output)
    for folder in (output, storage.join(output, PARTS_FOLDER)):  # what a killed earlier merge left (only
        storage.remove_temporaries(folder)  # the merge writes into this folder)
    for folder in part_folders:
        for uri in storage.glob(storage.join(folder, PARTS_FOLDER, "*-of-*.json")):
            part = json.loads(storage.read_text(uri))
            for file in part["files"]:
                storage.copy(storage.join(folder, file["name"]), storage.join(output, file["name"]))
            storage.write_text_atomic(storage.join(output, PARTS_FOLDER, storage.basename(uri)), dumps(part))
    return merge_manifests(output)


# the counts of a part, which the set's manifest sums (parts written before the byte counts were kept have none)
SUMMED_KEYS = (
    "num_records",
    "texts",
    "bytes_read",
    "text_bytes",
    "non_utf8_bytes",
    "tokens_written",
    "tokens_dropped",
)
# what differs between the parts of one set; every other key of a part manifest is a setting they share
PART_KEYS = ("part", "files", *SUMMED_KEYS, "token_counts")


def read_manifest(uri: str, parameter: str = "shards") -> dict[str, Any]:
    """The manifest of a finished shard folder; refuses, naming ``parameter``, a folder that is not one."""
    storage.check_uri(parameter, uri)
    manifest_uri = storage.join(uri, MANIFEST)
    if not storage.exists(manifest_uri):
        raise InvalidParameter(parameter, uri, f"holds no finished shard set (no {MANIFEST}; is the run complete?)")
    return json.loads(storage.read_text(manifest_uri))


def verify_files(uri: str, manifest: dict[str, Any], parameter: str = "shards", listed_in: str = MANIFEST) -> None:
    """Refuses, naming the file, a shard that is missing or whose size is not the one recorded when it was
    written (a truncated copy, a file replaced by another run). One metadata request a file, no reading."""
    for file in manifest["files"]:
        path = storage.join(uri, file["name"])
        if not storage.exists(path):
            raise InvalidParameter(parameter, uri, f"shard {file['name']} listed in {listed_in} is missing")
        actual = storage.size(path)
        if actual != file["bytes"]:
            raise InvalidParameter(
                parameter,
                uri,
                f"shard {file['name']} has {actual} bytes, {listed_in} says {file['bytes']}: it is truncated or "
                "was replaced; write the shards again",
            )


def dumps(data: dict[str, Any]) -> str:
    """A manifest as JSON for people: indented, but the token counts (one a vocabulary entry) on one line."""
    if "token_counts" not in data:
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    text = json.dumps({**data, "token_counts": "@counts@"}, indent=2, sort_keys=True)
    return text.replace('"@counts@"', json.dumps(data["token_counts"], separators=(",", ":"))) + "\n"


def manifest_for_people(manifest: dict[str, Any]) -> str:
    what = "the shard set" if "part" not in manifest else f"part {manifest['part']} of {manifest['num_parts']}"
    return (
        f"{what}: {manifest['num_records']:,} samples of {manifest['max_length']} tokens in "
        f"{len(manifest['files'])} file(s), {manifest['tokens_dropped']:,} tokens dropped (the full record: "
        "manifest.json, or --json)"
    )
