"""What a skeptic tries before believing a fine-tuned encoder: classifiers that read no context, scored on the same
splits as the probe's models, and the sampling error of a score.

Each baseline is a count classifier (multinomial naive Bayes with add-one smoothing) over features of a sample's
tokens, the model's own tokenizer's:

* ``majority class``: no feature, the training split's most frequent label for every sample;
* ``bag of words``: the counts of its tokens, order ignored;
* ``first token``, ``last token``: the one token a reader of a sentence's edges would look at (a capital, a final
  full stop);
* ``length``: its number of tokens.

A task that one of them solves does not measure what pre-training learns."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Features = Callable[[list[int]], list[Any]]
FEATURES: dict[str, Features] = {
    "majority class": lambda tokens: [],
    "bag of words": lambda tokens: tokens,
    "first token": lambda tokens: tokens[:1],
    "last token": lambda tokens: tokens[-1:],
    "length": lambda tokens: [len(tokens)],
}
BOOTSTRAP_DRAWS = 200


def count_classifier(
    train: Sequence[list[Any]], train_labels: Sequence[int], scored: Sequence[list[Any]], classes: int
) -> list[int]:
    """Multinomial naive Bayes: each scored sample's most probable class given its features' counts in training
    (add-one smoothing; a feature unseen in training counts for no class)."""
    prior = [0] * classes
    counts: list[dict[Any, int]] = [{} for _ in range(classes)]
    for features, label in zip(train, train_labels, strict=True):
        prior[label] += 1
        for feature in features:
            counts[label][feature] = counts[label].get(feature, 0) + 1
    known = set().union(*counts)
    totals = [sum(class_counts.values()) + len(known) for class_counts in counts]
    log_prior = [math.log(count) if count else -math.inf for count in prior]

    def predicted(features: list[Any]) -> int:
        score = [
            log_prior[label]
            + sum(math.log((counts[label].get(f, 0) + 1) / totals[label]) for f in features if f in known)
            for label in range(classes)
        ]
        return max(range(classes), key=lambda label: (score[label], prior[label]))

    return [predicted(features) for features in scored]


def baseline_predictions(
    train_tokens: Sequence[list[int]], train_labels: Sequence[int], scored_tokens: Sequence[list[int]], classes: int
) -> dict[str, list[int]]:
    """Each baseline's predictions on the scored samples, trained on the training split's."""
    return {
        name: count_classifier(
            [features(t) for t in train_tokens], train_labels, [features(t) for t in scored_tokens], classes
        )
        for name, features in FEATURES.items()
    }


def score_error(
    metric: str, score: Callable[[Sequence[int], Sequence[int]], float], predicted: Sequence[int], labels: Sequence[int]
) -> float:
    """The sampling error of a score on these samples: for accuracy the binomial's, sqrt(p (1 - p) / n); for another
    metric (F1, Matthews correlation) the spread of the bootstrap over the samples (fixed draws: the same every
    run). ``score`` computes the metric from predictions and labels."""
    import numpy as np

    count = len(labels)
    if count == 0:
        return 0.0
    if metric == "accuracy":
        accuracy = score(predicted, labels)
        return math.sqrt(accuracy * (1 - accuracy) / count)
    predicted, labels = np.asarray(predicted), np.asarray(labels)
    draws = np.random.default_rng(0).integers(0, count, size=(BOOTSTRAP_DRAWS, count))
    return float(np.std([score(predicted[draw], labels[draw]) for draw in draws], ddof=1))
