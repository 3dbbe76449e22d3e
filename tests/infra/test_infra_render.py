"""infra.render: the kustomize subset it implements, and what it refuses."""

from __future__ import annotations

import pytest

from infra.render import render, strategic_merge


def test_strategic_merge_by_key_and_replace():
    base = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "image": "x:1",
                    "args": ["p", "q"],
                    "env": [{"name": "K", "value": "1"}],
                },
                {"name": "b", "image": "y:1"},
            ],
            "tolerations": [{"key": "t1"}],
        }
    }
    patch = {
        "spec": {
            "containers": [
                {"name": "a", "args": ["r"], "env": [{"name": "L", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "z:1"},
            ],
            "tolerations": [{"key": "t2"}],
        }
    }
    merged = strategic_merge(base, patch)
    assert merged["spec"]["containers"] == [
        {
            "name": "a",
            "image": "x:1",
            "args": ["r"],
            "env": [{"name": "K", "value": "1"}, {"name": "L", "value": "2"}],
        },
        {"name": "c", "image": "z:1"},
    ]
    assert merged["spec"]["tolerations"] == [{"key": "t2"}]
    assert base["spec"]["containers"][1] == {"name": "b", "image": "y:1"}, "base unchanged"
    assert strategic_merge({"data": {"A": "1", "B": "2"}}, {"data": {"A": None}}) == {
        "data": {"B": "2"}
    }


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_overlay_namespace_images_and_patches(tmp_path):
    write(tmp_path / "base" / "kustomization.yaml", "resources: [d.yaml]\n")
    write(
        tmp_path / "base" / "d.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\n"
        "spec: {template: {spec: {containers: [{name: c, image: 'img:latest'}]}}}\n",
    )
    write(
        tmp_path / "o" / "kustomization.yaml",
        "namespace: ns\nresources: [../base]\npatches: [{path: p.yaml}]\n"
        "images: [{name: img, newName: reg/img, newTag: '2'}]\n",
    )
    write(
        tmp_path / "o" / "p.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec: {replicas: 3}\n",
    )
    (obj,) = render(tmp_path / "o")
    assert obj["metadata"]["namespace"] == "ns"
    assert obj["spec"]["replicas"] == 3
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/img:2"


def test_unsupported_features_are_refused(tmp_path):
    write(tmp_path / "kustomization.yaml", "resources: []\nreplicas: [{name: w, count: 2}]\n")
    with pytest.raises(ValueError, match="not implemented"):
        render(tmp_path)
    write(tmp_path / "kustomization.yaml", "configMapGenerator: [{name: c, literals: [A=1]}]\n")
    with pytest.raises(ValueError, match="disableNameSuffixHash"):
        render(tmp_path)
    with pytest.raises(ValueError, match="no kustomization.yaml"):
        render(tmp_path / "missing")
