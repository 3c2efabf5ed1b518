"""Fit a ConvMeter runtime model on a few measured networks and predict a held-out one.

Tiny networks from :mod:`hpcnb.models` are timed here (median of a few ``no_grad`` forward
passes on two threads) at several batch sizes; their per-sample costs come from the graph
IR (``hpcnb.perfmodel.network_features``). ``ConvMeter`` is fitted on all networks but one
and predicts the inference time of the one it never saw. Run it with
``python examples/perfmodel_fit.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hpcnb import models
from hpcnb.perfmodel import ConvMeter, Measurement, mape, network_features
from hpcnb.perfmodel.estimator import design_matrix

#: Networks measured for the fit; the last one is held out and predicted.
NETWORKS = ("resnet", "vgg", "densenet", "mobilenet_v2")
#: Batch sizes timed for every network.
BATCHES = (1, 4, 16, 64)


def measure(name: str, batches: tuple[int, ...], repeats: int) -> list[Measurement]:
    """Time a tiny zoo network's forward pass and pair it with its IR features.

    Args:
        name: Key of :data:`hpcnb.models.ZOO`.
        batches: Batch sizes to time.
        repeats: Timed forward passes per batch size (the median is kept).

    Returns:
        One :class:`~hpcnb.perfmodel.Measurement` per batch size, with the measured
        inference seconds (training time left unmeasured, NaN).
    """
    spec = models.ZOO[name]
    model = spec.build("tiny")
    sample = spec.example_input("tiny", batch=2)
    features = network_features(model, tuple(sample.shape[1:]), name, name, training=False)
    rows = []
    with torch.no_grad():
        for batch in batches:
            x = spec.example_input("tiny", batch=batch)
            model(x)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
            rows.append(Measurement(features, batch, statistics.median(times), float("nan")))
    return rows


def main() -> None:
    """Measure, fit on the first networks, and print the prediction for the held-out one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per point")
    args = parser.parse_args()
    torch.set_num_threads(2)
    start = time.perf_counter()
    rows = [row for name in NETWORKS for row in measure(name, BATCHES, args.repeats)]
    held_out = NETWORKS[-1]
    train = [r for r in rows if r.features.family != held_out]
    test = [r for r in rows if r.features.family == held_out]
    model = ConvMeter("inference").fit(
        design_matrix(train, "inference"), [r.inference_s for r in train]
    )
    predicted = model.predict(design_matrix(test, "inference"))
    print(f"fitted ConvMeter on {len(train)} measurements of {', '.join(NETWORKS[:-1])}")
    print(f"held-out network: {held_out}")
    print(f"{'batch':>5} {'measured ms':>12} {'predicted ms':>13}")
    for row, p in zip(test, predicted, strict=True):
        print(f"{row.batch:>5} {1e3 * row.inference_s:>12.3f} {1e3 * p:>13.3f}")
    error = mape(predicted, [r.inference_s for r in test])
    print(f"MAPE on the held-out network: {100 * error:.1f} %")
    print(f"measured and fitted in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
