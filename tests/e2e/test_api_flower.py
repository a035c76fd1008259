"""``ldpfl.federate(..., engine="flower")``: the API's Flower engine gives the local engine's run (slow).

Flower's simulation engine starts a SuperLink, Ray and one ClientApp per client file: half a minute on an idle
2-core machine, which is why this is apart from ``test_api.py``. Needs ``flwr[simulation]``.
"""

from __future__ import annotations

import pytest

import ldpfl


@pytest.mark.slow
def test_the_flower_engine_through_the_api_equals_the_local_one(tmp_path) -> None:
    pytest.importorskip("flwr", reason="the Flower engine needs pip install -e '.[flower]'")
    pytest.importorskip("ray")
    export = ldpfl.export(dataset="mnist5k", clients=2, extractor="none", limit=300, seed=1, out=tmp_path / "run")
    settings = {"rounds": 2, "hidden": (16,), "seed": 1, "drop_per_round": 1}
    local = ldpfl.federate(export.run_dir, out=tmp_path / "local", **settings)
    events: list[ldpfl.Progress] = []
    flower = ldpfl.federate(export.run_dir, engine="flower", out=tmp_path / "flower", progress=events.append,
                            **settings)
    assert isinstance(flower, ldpfl.FederateResult) and flower.engine == "flower"
    assert flower.outputs.directory == tmp_path / "flower" and flower.outputs.model.is_file()
    assert flower.outputs.checkpoint is None
    for f, loc in zip(flower.rounds, local.rounds, strict=True):
        for key in ("round", "selected", "dropped", "aggregated", "excluded"):
            assert f[key] == loc[key], key
    assert flower.test_accuracy == pytest.approx(local.test_accuracy, rel=1e-5, abs=1e-6)
    assert flower.client_guarantees == local.client_guarantees == export.release_guarantees
    assert flower.to_dict()["config"]["engine"] == "flower"
    assert events and (events[-1].job, events[-1].done, events[-1].total) == ("federate", 2, 2)
