"""Runtime code of the pipeline's steps: each module is one step, runnable as ``python -m components.<step>``;
``lib`` holds what the steps share."""

import os

# transformers' TF models need Keras 2 (tf-keras); TF >= 2.16 would otherwise load Keras 3. It has to be set
# before TensorFlow is imported, in every process, so it lives in the package's import.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ start-up chatter (oneDNN, missing CUDA) drowns the progress lines; warnings still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
