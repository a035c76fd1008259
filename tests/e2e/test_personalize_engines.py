"""Both engines' global models personalize identically at one seed (issue 41).

One tiny federation (MNIST-5k's raw pixels, 2 local-only silos, one DP-SGD round of a linear head) runs on the
local engine and on Flower's simulation engine with the same seed. The two global models agree to float32
rounding (the engines aggregate the same replies in a different order of float operations), and personalizing
each with every method gives the same own held-out figures, the same accountant and the same interpolation weight.
Flower's simulation starts Ray: about 20 s on an idle 2-core machine. Needs ``flwr[simulation]``.
"""

from __future__ import annotations

import pytest
import torch

import ldpfl
from ldpfl.stage2_federate.model_file import read_model

SETTINGS = {"rounds": 1, "dp_sgd": True, "noise_multiplier": 2.0, "optimizer": "sgd", "hidden": (), "seed": 1,
            "device": "cpu"}


def _close(first, second) -> None:
    a, b = read_model(first).state_dict, read_model(second).state_dict
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0.0, atol=1e-6)


@pytest.mark.slow
def test_both_engines_global_models_personalize_identically(tmp_path, marked) -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")
    from flower_helpers import leftovers

    run = ldpfl.export(dataset="mnist5k", clients=2, extractor="none", limit=200, seed=1, local_only=True,
                       out=tmp_path / "run").run_dir
    models = {engine: ldpfl.federate(run, engine=engine, out=tmp_path / engine, **SETTINGS).outputs.model
              for engine in ("local", "flower")}
    assert leftovers(marked) == []
    assert read_model(models["flower"]).trained_on["engine"] == "flower"
    _close(models["local"], models["flower"])
    for method in ("clear", "dp", "interpolate"):
        made = {engine: ldpfl.personalize(run, client_index=0, method=method, model=path, epochs=2, steps=3, seed=4,
                                          out=tmp_path / f"{engine}-{method}")
                for engine, path in models.items()}
        local, flower = made["local"].summary, made["flower"].summary
        assert local["own_heldout"] == flower["own_heldout"], method
        assert local.get("accountant") == flower.get("accountant") and made["local"].epsilon == made["flower"].epsilon
        assert local.get("interpolation") == flower.get("interpolation")
        _close(made["local"].model, made["flower"].model)
    assert made["local"].summary["interpolation"]["table"]  # the interpolate run compared its weights
