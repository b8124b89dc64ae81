#!/bin/sh
# Prints one group of a TensorFlow runtime's fully resolved pins, which the images install without resolution
# (pip install --no-deps -r): their dependency layers are made from it.
#   common      what the steps import but TensorFlow: the first layer of the CPU image and of the TPU image, from
#               the same instructions, so that a machine building both installs it once (Docker's layer cache)
#   tensorflow  TensorFlow for CPUs: the CPU image, at the default runtime only
#   tpu         tensorflow-tpu and the libtpu build it names: the TPU image, never tensorflow beside it
# RUNTIME picks the pins: tf2.20, the default, is the project's constraints.txt; another is
# containers/tpu-RUNTIME.constraints.txt. The tests' tools are in no image.
set -eu
runtime=${RUNTIME:-tf2.20}
pins=constraints.txt
if [ "$runtime" != tf2.20 ]; then pins=containers/tpu-$runtime.constraints.txt; fi
test -f "$pins" || { echo "RUNTIME=$runtime: no $pins" >&2; exit 1; }
tools='pytest|pytest-timeout|pytest-xdist|execnet|ruff|gcp-storage-emulator|iniconfig|pluggy|uv'
case "${1:-}" in
  common) grep -vE "^(tensorflow|tensorflow-tpu|libtpu|$tools)==" "$pins" ;;
  tensorflow)
    [ "$runtime" = tf2.20 ] || { echo "RUNTIME=$runtime: the CPU image is built at the default runtime" >&2; exit 1; }
    grep -E '^tensorflow==' "$pins" ;;
  tpu) grep -E '^(tensorflow-tpu|libtpu)==' "$pins" ;;
  *) echo "usage: RUNTIME=tf2.20 sh containers/pins.sh common|tensorflow|tpu" >&2; exit 2 ;;
esac
